#!/bin/bash
# Session 35, call 3 (kind nvidia-h200-x4, NAMED, right after call 2; no carry while warm): the proxy
# grid at lr 1e-3, depths 3, 4 x widths 256, 384, 512, seed 1, each format also with
# policy: {preset: default, rollback: 200} (--rollback 200): 60 runs at 16 a GPU. Coverage (four new
# cells) and the first measurement of a shorter rollback against the default's 5 S = 500 steps:
# the report's "Rollback distance" section, pair by pair (rescued, replayed steps, extra compute).
set -u
test -e /tmp/k/dist/bin/keeld || { echo "machine not warm" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
name=grid-h-lr1e-3-seed1-rb200
python3 scripts/policy-grid gen --name $name --layers 3,4 --widths 256,384,512 --lrs 1e-3 --seeds 1 \
  --rollback 200 --gpus 0.062 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7393 --deadline-s 550 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tail -8 $OUT/$name-run.log; sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -16
sed -n '/## Rollback distance/,/## Earlier/p' $OUT/$name-report.md | head -30
