#!/bin/bash
# Session 31 plan, calls C and D (x4; C carries ["devpack31c"]: train.01.txt.xz): tokenizes the corpus
# once (call C), then issue 14's GPT slice through keeld and keel-worker on the 4 GPUs, shuffled
# batches (gen --model gpt writes data.shuffle: true), 3 seeds at learning rate LR, 4 runs per GPU.
#   bash slice.sh LR DEADLINE_S
set -u
lr=$1; deadline=$2
export LD_LIBRARY_PATH=/tmp/k/dist/lib
if [ ! -e /tmp/corpus/corpus_train.bin ]; then
  cp devpack31c/train.01.txt.xz /tmp/corpus/
  python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
    --bpe-dir /tmp/k/bpe 2>&1 | tail -2 | tee $OUT/tokenize.txt
fi
mkdir -p data && cp -n /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
name=gpt-lr$lr
python3 scripts/policy-grid gen --name $name --model gpt --widths 512 --layers 8 --lrs $lr --seeds 1,2,3 \
  --train $PWD/data/corpus_train.bin --val $PWD/data/corpus_val.bin --gpus 0.25 -o /tmp/$name.yaml
python3 scripts/policy-grid run --bin /tmp/k/dist/bin --sweep /tmp/$name.yaml --dir /tmp/gs-$lr --out $OUT \
  --deadline-s $deadline > $OUT/$name-run.log 2>&1
echo "rc=$?" >> $OUT/$name-run.log
python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md > /dev/null 2>&1
tail -6 $OUT/$name-run.log; head -40 $OUT/$name-report.md
