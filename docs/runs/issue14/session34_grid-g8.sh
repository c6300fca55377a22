#!/bin/bash
# Session 34, call 3 (kind nvidia-h200-x4, NAMED, right after 2b; no carry while warm): the proxy grid
# at lr 3e-4, which has never run: depth {3, 4, 6} x width {256, 384, 512}, seed 1, the three formats
# unprotected and with policy: default, plus fp32: 63 runs of 9000 steps, 16 per GPU at 0.062 (all at once; 0.0625 is not whole thousandths and keeld refuses it).
# Session 28's grid-e4 ran 21 runs at 8 per GPU on one H200 in about 7 minutes (about 2.2 ms of GPU
# a step-run): 63 over 4 GPUs should take 5-6 minutes if the GPUs stay the bottleneck. A run the
# deadline cancels is left out of the report's pairs (it says so).
set -u
test -e /tmp/k/dist/bin/keeld || { echo "machine not warm" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
name=grid-g8-lr3e-4-seed1
python3 scripts/policy-grid gen --name $name --layers 8 --widths 256,384,512 --lrs 3e-4 --seeds 1 \
  --gpus 0.15 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7396 --deadline-s 300 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tail -8 $OUT/$name-run.log; sed -n '1,/## Every run/p' $OUT/$name-report.md | head -50
