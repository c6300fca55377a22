#!/bin/bash
# Session 34, call 2b (kind nvidia-h200-x4, NAMED, right after 2a; carry ["devpack34c"]: keeld,
# keel-worker, keel + libs; corpus part 00 came with call 2a2). Tokenizes the whole corpus, then issue 14's GPT slice at
# lr 2e-3 with the policy's snapshots in memory (8895519; session 33's ran with them on disk: 191-300 s outside the steps)
# 15 runs, 4 per GPU; the report's 'time outside the steps' is the figure.
set -u
test -e /tmp/k/dist/bin/keel-train || { echo "machine not warm: /tmp/k missing" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
tar -xJf devpack34c/s.txz -C /tmp/k || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack34c/s.txz')).extractall('/tmp/k')"
test -e /tmp/corpus/train.00.txt.xz || { echo "corpus part 00 missing: run c2a2.sh first" | tee $OUT/error.txt; exit 3; }
python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
  --bpe-dir /tmp/k/bpe 2>&1 | tail -2 | tee $OUT/tokenize.txt
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
S=${SEEDS:-1,2,3}; lr=2e-3; name=gpt-lr$lr-s${S//,/}
python3 scripts/policy-grid gen --name $name --model gpt --widths 512 --layers 8 --lrs $lr --seeds $S \
  --train $PWD/data/corpus_train.bin --val $PWD/data/corpus_val.bin --gpus 0.25 -o /tmp/$name.yaml
cp /tmp/$name.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
  --port ${PORT:-7391} --deadline-s ${DEADLINE:-530} > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz --lm-rule own -o $OUT/$name-report-own.md > /dev/null 2>&1
tail -6 $OUT/$name-run.log; sed -n '1,/## Earlier/p' $OUT/$name-report.md | head -60
