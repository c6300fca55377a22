#!/bin/bash
# Session 31 plan, call D beside the second GPT slice: issue 14's proxy grid at a configuration not
# yet run (depth 4, width 384, lr 1e-3; the MX paper's three formats; seeds 1-3), each format
# unprotected, with policy: default and with policy: default + probation {after: 500}, plus fp32:
# 30 runs of 9000 steps through a second keeld/keel-worker (port 7392), 8 per GPU.
#   bash proxy_slice.sh DEADLINE_S
set -u
deadline=$1
export LD_LIBRARY_PATH=/tmp/k/dist/lib
name=grid-f-probation
python3 scripts/policy-grid gen --name $name --layers 4 --widths 384 --lrs 1e-3 --seeds 1,2,3 \
  --probation 500 --gpus 0.125 -o /tmp/$name.yaml
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/$name --out $OUT \
  --port 7392 --deadline-s $deadline > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tail -4 $OUT/$name-run.log; head -30 $OUT/$name-report.md
