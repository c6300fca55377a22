#!/bin/bash
# Session 29 CHON reproduction, calls B and C: gla then sa at d512L8, 200M tokens per run, one
# scheme per GPU (scripts/reproduce-chon, one WORK per scheme so that the four programs share no
# file), each stopping at DEADLINE seconds and continuing from its checkpoint next call. Then the
# report over whatever exists, and every run's metrics (no checkpoints) copied to $OUT.
# (The call ran with that folder named "work"; it is "runs" here, as the repository test wants.)
#   bash session29_chon_run.sh DEADLINE [tokenize]
set -u
deadline=$1
start=$(date +%s)
export KEEL_TRAIN=/tmp/k/dist/bin/keel-train LD_LIBRARY_PATH=/tmp/k/dist/lib
if [ "${2:-}" = tokenize ]; then
  cp devpackb/train.01.txt.xz /tmp/corpus/
  python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train $KEEL_TRAIN --bpe-dir /tmp/k/bpe 2>&1 | tail -3 | tee $OUT/tokenize.txt
fi
left=$(( deadline - ($(date +%s) - start) ))
i=0
for s in bf16 nvfp4_recipe chon nvfp4_hcp; do
  CUDA_VISIBLE_DEVICES=$i scripts/reproduce-chon run --train /tmp/corpus/corpus_train.bin \
    --val /tmp/corpus/corpus_val.bin --size ${SIZE:-d512L8} --tokens ${TOKENS:-200e6} --models gla,sa --schemes $s \
    ${EXTRA:-} \
    --work /tmp/chon-$s --out /tmp/chon-out-$s --deadline-s $left > $OUT/harness-$s.log 2>&1 &
  i=$((i + 1))
done
wait
echo "elapsed $(( $(date +%s) - start )) s"
mkdir -p /tmp/chon && cp /tmp/chon-bf16/base.yaml /tmp/chon/
for s in bf16 nvfp4_recipe chon nvfp4_hcp; do
  for r in /tmp/chon-$s/*-$s; do ln -sfn $r /tmp/chon/$(basename $r); done
done
scripts/reproduce-chon report --work /tmp/chon --out $OUT/chon > $OUT/report.log 2>&1; echo "report rc=$?"
for r in /tmp/chon/*-*; do
  mkdir -p $OUT/runs/$(basename $r)
  cp $r/run.yaml $r/DONE $r/command.txt $OUT/runs/$(basename $r)/ 2>/dev/null
  xz -c $r/metrics.jsonl > $OUT/runs/$(basename $r)/metrics.jsonl.xz
  echo "$(basename $r): $(tail -1 $r/metrics.jsonl | cut -c1-120) $(ls $r/DONE 2>/dev/null)"
done
cp /tmp/chon/base.yaml $OUT/runs/
du -sh $OUT
