#!/bin/bash
# Session 33, call 2b (kind nvidia-h200-x4, NAMED, right after 2a; carry ["devpack33c"]: keeld,
# keel-worker, keel + libs; corpus part 00). Tokenizes the whole corpus, then issue 14's GPT slice at
# lr 2e-3 with today's policy: default (a language model's bias rule on the probe and the ladder that
# moves the head to BF16 first; commit 50ce0f8). 15 runs, 4 per GPU.
set -u
test -e /tmp/k/dist/bin/keel-train || { echo "machine not warm: /tmp/k missing" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack33c/s.txz')).extractall('/tmp/k')"
cp devpack33c/train.00.txt.xz /tmp/corpus/
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
# call 3 (seeds 4-6) ran the same with SEEDS=4,5,6 PORT=7393 DEADLINE=540 after call 2b had tokenized the corpus
