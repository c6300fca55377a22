#!/usr/bin/env bash
# scripts/reproduce-chon end to end on the CPU with a real keel-train: byte shards of this
# repository's docs, the tiny size, both models in the four schemes. A first call with a deadline
# stops inside a run (exit 143, a checkpoint, no DONE); the second continues it and finishes every
# run; the report has both models' tables, CHON's gap line and the plots.
set -euo pipefail
root="$PWD"
train="$root/worker/engine/keel-train"
work="${TEST_TMPDIR:-/tmp}/reproduce_chon"
rm -rf "$work" && mkdir -p "$work"
cat "$root"/README.md "$root"/docs/*.md > "$work/text.txt"
"$train" prepare-text "$work/text.txt" "$work/docs" --val-fraction 0.05 > /dev/null
run() {
  KEEL_TRAIN="$train" "$root/scripts/reproduce-chon" run --train "$work/docs_train.bin" --val "$work/docs_val.bin" \
    --size tiny --tokens 20480 --batch 4 --seq 64 --backend cpu --analytics-every 10 --eval-every 40 \
    --val-batches 2 --lr 3e-3 --work "$work/w" --out "$work/o" "$@"
}
set +e
run --deadline-s 2 2> "$work/first.log"
rc=$?
set -e
[ "$rc" = 143 ] || { echo "deadline call: exit $rc, want 143"; cat "$work/first.log"; exit 1; }
stopped=$(ls -d "$work"/w/*-* | while read d; do [ -e "$d/DONE" ] || echo "$d"; done | head -1)
ls "$stopped"/checkpoints/step_* > /dev/null || { echo "no checkpoint in $stopped"; exit 1; }
run 2> "$work/second.log" || { cat "$work/second.log"; exit 1; }
for m in sa gla; do
  for s in bf16 nvfp4_recipe nvfp4_hcp chon; do
    [ -e "$work/w/$m-$s/DONE" ] || { echo "$m-$s did not finish"; cat "$work/second.log"; exit 1; }
    last=$(tail -1 "$work/w/$m-$s/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
    [ "$last" = 80 ] || { echo "$m-$s: last step $last, want 80"; exit 1; }
  done
done
grep -q "continuing from its newest checkpoint" "$work/second.log"
summary="$work/o/summary.md"
grep -q "^## sa (llama)" "$summary"
grep -q "^## gla (gla)" "$summary"
grep -q "^| chon | 80 | 0.0M | yes |" "$summary"
grep -q "CHON's gap to bf16 against the NVFP4 recipe's" "$summary" || grep -q "^| nvfp4_recipe | 80 |" "$summary"
grep -q "### gla bf16: outliers of the forward inputs" "$summary"
for p in sa-val sa-outliers gla-val gla-outliers; do head -c 4 "$work/o/plots/$p.svg" | grep -q "<svg"; done
python3 -c "import json; d=json.load(open('$work/o/runs.json')); assert set(d) == {'sa', 'gla'}, d"
echo "reproduce-chon: deadline, resume and report OK"
