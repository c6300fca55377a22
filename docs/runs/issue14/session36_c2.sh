#!/bin/bash
# Session 36, call 2 (kind nvidia-h200-x4, NAMED, right after call 1; no carry while warm): the cells whose
# blow-ups were not rescued in session 35 (all where fp32 itself blows up), again with today's main: a
# policy rollback returns to the oldest state kept instead of failing, and the ring holds the start.
# Each format unprotected, policy: default, {preset: default, rollback: 200} and
# {preset: default, lr_fallbacks: 3}, and fp32. Sweep A: depths 3 and 6, width 512, lr 1e-3 (26 runs, GPUs
# 0-1); sweep B: depth 8, width 512, lr 6e-4 (13 runs, GPUs 2-3), side by side.
set -u
# A fresh machine (not warm): needs carry ["devpack36a", "devpack36s"].
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack36a/a.txz', 'devpack36s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')" \
  || { echo "machine not warm and no packs carried"; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
O=$OUT; OUT=/tmp/o2; mkdir -p $OUT
a=grid-i-d512-lr1e-3-seed1; b=grid-i8-d512-lr6e-4-seed1
python3 scripts/policy-grid gen --name $a --layers 3,6 --widths 512 --lrs 1e-3 --seeds 1 --rollback 200 \
  --lr-fallbacks 3 --gpus 0.075 -o /tmp/$a.yaml && cp /tmp/$a.yaml $OUT/
python3 scripts/policy-grid gen --name $b --layers 8 --widths 512 --lrs 6e-4 --seeds 1 --rollback 200 \
  --lr-fallbacks 3 --gpus 0.14 -o /tmp/$b.yaml && cp /tmp/$b.yaml $OUT/
run() {  # name, port, gpus
  python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$1.yaml --dir /tmp/gs-$1 --out $OUT \
    --port $2 --deadline-s 540 --worker-args "--gpus $3" > $OUT/$1-run.log 2>&1
  echo "rc=$?" >> $OUT/$1-run.log
  python3 scripts/policy-grid report $OUT/$1-runs.jsonl --series $OUT/$1-series.csv.gz -o $OUT/$1-report.md > /dev/null 2>&1
}
run $a 7393 0,1 & PA=$!
run $b 7394 2,3 & PB=$!
wait $PA $PB
tar -C /tmp -czf $O/c2.tgz o2
for n in $a $b; do tail -3 $OUT/$n-run.log; sed -n '1,/## Per configuration/p' $OUT/$n-report.md | head -8
  sed -n '/## Every run/,$p' $OUT/$n-report.md | grep -E "^\| mx" | cut -c1-260
  sed -n '/## Rollback distance/,/^| format/p;/## Learning-rate fallbacks/,/^| format/p' $OUT/$n-report.md; done
