#!/bin/bash
# Session 36, call 4 (kind nvidia-h200-x4, NAMED; carry ["devpack36a", "devpack36s"]): the hardest cell, lr 1e-3
# at depth 8 (grid h8: 4 of 9 rescued by policy: default), with the preset as session 36 proposes it:
# {preset: default, rollback: 200, lr_fallbacks: 3}, beside each format unprotected and fp32 (21 runs on
# GPUs 0-3). On GPU 0 beside it: trainer_parity_test Llama and Gla (the head-in-chunks build). One tarball back.
# (The parity tests failed here for want of data/fortunes_train.bin, which this call did not carry; call 5 ran
# them again with it: docs/runs/issue12/session36_parity_llama_gla.txt.)
set -u
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack36a/a.txz', 'devpack36s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')" \
  || { echo "machine not warm and no packs carried"; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
O=$OUT; OUT=/tmp/o4; mkdir -p $OUT
name=grid-j8-lr1e-3-seed1-rb200-lrf3
cp docs/runs/issue14/$name.yaml /tmp/$name.yaml && cp /tmp/$name.yaml $OUT/
( python3 scripts/policy-grid run --bin $B --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
    --port 7396 --deadline-s 370 > $OUT/$name-run.log 2>&1
  echo "rc=$?" >> $OUT/$name-run.log
  python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md \
    > /dev/null 2>&1 ) &
GRID=$!
( export CUDA_VISIBLE_DEVICES=0
  timeout 300 $B/trainer_parity_test --gtest_filter='*Llama*:*Gla*' > $OUT/parity_llama_gla.txt 2>&1
  echo "parity rc=$?" >> $OUT/parity_llama_gla.txt ) &
wait $GRID; wait
tar -C /tmp -czf $O/c4.tgz o4
grep -E "^(llama|gla) |OK \]|FAILED|rc=" $OUT/parity_llama_gla.txt
tail -3 $OUT/$name-run.log
sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -14
sed -n '/## Every run/,/^## [A-Z]/p' $OUT/$name-report.md | grep -E "^\| mx" | cut -c1-300
