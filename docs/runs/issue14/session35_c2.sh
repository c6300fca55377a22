#!/bin/bash
# Session 35, call 2 (kind nvidia-h200-x4, NAMED, right after the previous call; no carry while warm):
# the proxy grid at lr 6e-4, depths 3, 4, 6 x widths 256, 384, 512, seed 1: 63 runs, 16 a GPU (as session
# 34's grid-g at 3e-4: 426 s). More blow-ups at this lr mean more rollbacks (replays), so it may run longer.
set -u
test -e /tmp/k/dist/bin/keeld || { echo "machine not warm" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
name=grid-h-lr6e-4-seed1
python3 scripts/policy-grid gen --name $name --layers 3,4,6 --widths 256,384,512 --lrs 6e-4 --seeds 1 \
  --gpus 0.062 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7392 --deadline-s 550 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tail -8 $OUT/$name-run.log; sed -n '1,/## Every run/p' $OUT/$name-report.md | head -50
