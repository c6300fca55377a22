#!/bin/bash
# Session 35, call 4 (x4, fresh machine; carry devpack35s): lr 1e-3, depth 6, widths 256 and 512, seed 1,
# with the rollback-200 variant (20 runs, 5 a GPU).
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack35s/s.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
O=$OUT; export OUT=/tmp/o4; mkdir -p $OUT
name=grid-h6-lr1e-3-seed1-rb200
python3 scripts/policy-grid gen --name $name --layers 6 --widths 256,512 --lrs 1e-3 --seeds 1 \
  --rollback 200 --gpus 0.2 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7394 --deadline-s 330 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tar -C /tmp/o4 -czf $O/c4.tgz .
tail -5 $OUT/$name-run.log; sed -n '/## Rollback distance/,/## Earlier/p' $OUT/$name-report.md | head -20
