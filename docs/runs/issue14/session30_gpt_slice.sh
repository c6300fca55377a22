#!/bin/bash
# Session 30, call D (same x4 machine, right after C): issue 14's GPT slice through keeld and
# keel-worker (current main's binaries from call C's /tmp/m) at the learning rate call C's probe found.
#   bash d.sh LR DEADLINE_S
set -u
lr=$1; deadline=$2
export LD_LIBRARY_PATH=/tmp/m/dist/lib
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/gpt-gpu.txt
python3 scripts/policy-grid gen --name gpt-slice --model gpt --widths 512 --layers 8 --lrs $lr --seeds 1,2,3 \
  --train $PWD/data/corpus_train.bin --val $PWD/data/corpus_val.bin --gpus 0.5 -o /tmp/gpt-slice.yaml
cp /tmp/gpt-slice.yaml $OUT/
python3 scripts/policy-grid run --bin /tmp/m/dist/bin --sweep /tmp/gpt-slice.yaml --dir /tmp/gs --out $OUT \
  --deadline-s $deadline > $OUT/gpt-slice-run.log 2>&1
echo "rc=$?" >> $OUT/gpt-slice-run.log
python3 scripts/policy-grid report $OUT/gpt-slice-runs.jsonl --series $OUT/gpt-slice-series.csv.gz -o $OUT/gpt-slice-report.md > /dev/null 2>&1
tail -8 $OUT/gpt-slice-run.log; head -60 $OUT/gpt-slice-report.md
