#!/bin/bash
# Session 32, call 3 (kind nvidia-h200-x4, NAMED, right after call 3a; carry ["devpack32c"]:
# s.txz = keeld, keel-worker, keel + libs; train.01.txt.xz). Tokenizes the whole corpus (60.2M tokens, 22 s), then the GPT slice at lr 2e-3
# again, now with the default policy's 1.1x drift rule for language models: 15 runs, 4 per GPU,
# deadline 520 s.
set -u
test -e /tmp/k/dist/bin/keel-train || { echo "machine not warm: /tmp/k missing" | tee $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack32c/s.txz')).extractall('/tmp/k')"
cp devpack32c/train.01.txt.xz /tmp/corpus/
rm -f /tmp/corpus/corpus_*.bin data/corpus_train.bin data/corpus_val.bin
python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
  --bpe-dir /tmp/k/bpe 2>&1 | tail -2 | tee $OUT/tokenize.txt
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
lr=2e-3; name=gpt-lr$lr-drift
python3 scripts/policy-grid gen --name $name --model gpt --widths 512 --layers 8 --lrs $lr --seeds 1,2,3 \
  --train $PWD/data/corpus_train.bin --val $PWD/data/corpus_val.bin --gpus 0.25 -o /tmp/$name.yaml
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$lr --out $OUT \
  --deadline-s 510 > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz --lm-rule own -o $OUT/$name-report-own.md > /dev/null 2>&1
tail -6 $OUT/$name-run.log; head -40 $OUT/$name-report.md
