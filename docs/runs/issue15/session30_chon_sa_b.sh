#!/bin/bash
# Session 30 plan, call B (carry ["devpackb"]: fv.txz = flash variants, train.01.txt.xz):
# tokenize, SA runs on GPUs 1-3 at once and on GPU 0 after the flash variants (branch
# flash-occupancy's docs/runs/issue12/flash_variants.sh, copied here as flash_variants.sh).
#   bash b.sh DEADLINE
set -u
deadline=$1; start=$(date +%s)
export KEEL_TRAIN=/tmp/k/dist/bin/keel-train LD_LIBRARY_PATH=/tmp/k/dist/lib
cp devpackb/train.01.txt.xz /tmp/corpus/
python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train $KEEL_TRAIN --bpe-dir /tmp/k/bpe 2>&1 | tail -2 | tee $OUT/tokenize.txt
sa() {  # gpu scheme
  local left=$(( deadline - ($(date +%s) - start) ))
  CUDA_VISIBLE_DEVICES=$1 scripts/reproduce-chon run --train /tmp/corpus/corpus_train.bin \
    --val /tmp/corpus/corpus_val.bin --size d512L8 --tokens 200e6 --models sa --schemes $2 \
    --work /tmp/chon-$2 --out /tmp/co-$2 --deadline-s $left > /tmp/h-$2.log 2>&1
}
sa 1 nvfp4_recipe & sa 2 chon & sa 3 nvfp4_hcp &
# Only a few small files come back from $OUT: the variants write under /tmp/fvout, and their
# summary plus one archive of the details come back.
(mkdir -p /tmp/fvout && CUDA_VISIBLE_DEVICES=0 OUT=/tmp/fvout bash flash_variants.sh > /tmp/fvout/stdout.txt 2>&1
 cp /tmp/fvout/summary.txt $OUT/flash-summary.txt; tar cf - -C /tmp fvout | xz > $OUT/flash-details.tar.xz
 sa 0 bf16) &
wait
