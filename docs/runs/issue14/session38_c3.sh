#!/bin/bash
# Session 38, call 3 (kind nvidia-h100-x4, NAMED, right after call 2: warm, /tmp/k holds its binaries; carry
# ["devpack38c"]: the corpus text (parts 00, 01, val) and GPT-2's BPE). Tokenizes the corpus, then issue 14's GPT slice
# with today's preset: width 512, 8 layers, lr 2e-3, MXFP8 and MXFP4 unprotected and with policy: default, bf16
# reference, seeds $SEEDS (default 1,2,3), 4 runs a GPU (session 34's sweep, rerun whole: the head-chunk change moved
# the MX GPT head's bits). ONE tarball back ($OUT/c3.tgz).
set -u
O=$OUT; OUT=/tmp/o3; mkdir -p $OUT /tmp/corpus
test -e /tmp/k/dist/bin/keel-train || { echo "machine not warm: /tmp/k missing" | tee $O/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack38c/bpe.txz')).extractall('/tmp/k')"
cp devpack38c/*.txt.xz /tmp/corpus/
t0=$SECONDS
python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
  --bpe-dir /tmp/k/bpe > $OUT/tokenize.txt 2>&1
echo "tokenize rc=$? in $((SECONDS - t0)) s" >> $OUT/tokenize.txt
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
S=${SEEDS:-1,2,3}; [ $SECONDS -gt 130 ] && S=1,2  # 15 runs took 434 s in session 34
lr=2e-3; name=gpt-l-lr$lr-s${S//,/}
python3 scripts/policy-grid gen --name $name --model gpt --widths 512 --layers 8 --lrs $lr --seeds $S \
  --train $PWD/data/corpus_train.bin --val $PWD/data/corpus_val.bin --gpus 0.25 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
DL=$((575 - SECONDS))
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port 7399 --deadline-s $DL > $OUT/$name-run.log 2>&1
echo "rc=$? (deadline $DL s)" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tar -C /tmp -czf $O/c3.tgz o3
tail -3 $OUT/tokenize.txt; tail -6 $OUT/$name-run.log; sed -n '/## Overall/,/## Targets/p' $OUT/$name-report.md | head -30
