#!/bin/bash
# Session 36, call 3 (kind nvidia-h200-x4, NAMED, right after call 2; no carry while warm): lr 6e-4,
# depths 3 and 4 x widths 384 and 512 (7 of grid h's 9 blow-ups at this lr were there), seed 1, each format
# unprotected, policy: default, {preset: default, rollback: 200} and {preset: default, probation: {after: 500}},
# and fp32: 52 runs at 13 a GPU. The rollback-distance comparison at a second learning rate, and the first
# probation slice to finish (session 31's was cut off by the deadline).
set -u
# A fresh machine (not warm): needs carry ["devpack36a", "devpack36s"].
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack36a/a.txz', 'devpack36s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')" \
  || { echo "machine not warm and no packs carried"; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
O=$OUT; OUT=/tmp/o3; mkdir -p $OUT
name=grid-i-lr6e-4-seed1-rb200-pr500
python3 scripts/policy-grid gen --name $name --layers 3,4 --widths 384,512 --lrs 6e-4 --seeds 1 \
  --rollback 200 --probation 500 --gpus 0.075 -o /tmp/$name.yaml && cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7395 --deadline-s 550 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tar -C /tmp -czf $O/c3.tgz o3
tail -4 $OUT/$name-run.log; sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -16
sed -n '/## Probation/,/^| format/p;/## Rollback distance/,/## Earlier/p' $OUT/$name-report.md | head -50
