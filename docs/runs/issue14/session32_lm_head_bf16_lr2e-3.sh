#!/bin/bash
# Session 32, call 5 (x4). Its first version ran 8 runs from a loop whose helper clobbered the loop's
# variable, so only bf16_s1, mxfp8_s1 and mxfp8_head_bf16_s1 started (3000 steps each, run 3 per the
# earlier lines). This second version (call 5b) ran the four below, one per GPU; the summary has all seven.
set -u
test -e /tmp/k/dist/bin/keel-train || { echo "not warm" > $OUT/error.txt; exit 3; }
test -e /tmp/corpus/corpus_train.bin || { echo "no corpus" > $OUT/error.txt; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
mkdir -p /tmp/lm5
pids=()
run() { local gpu=$1 name=$2; shift 2; local sets=(); local a; for a in "$@"; do sets+=(--set "$a"); done
  CUDA_VISIBLE_DEVICES=$gpu timeout 135 /tmp/k/dist/bin/keel-train --config lm5.yaml --run-dir /tmp/lm5/$name --quiet \
    --set optimizer.lr=2e-3 "${sets[@]}" > /tmp/lm5/$name.log 2>&1 & pids+=($!); }
run 0 mxfp4_head_bf16_s1 seed=1 precision=mxfp4 precision.bf16_head=true; run 1 mxfp4_head_bf16_s3 seed=3 precision=mxfp4 precision.bf16_head=true; run 2 mxfp8_head_bf16_s2 seed=2 precision.bf16_head=true; run 3 mxfp4_s1 seed=1 precision=mxfp4
summarize() { python3 - > $OUT/lm5_summary.txt <<'PY'
import json, glob
for path in sorted(glob.glob("/tmp/lm5/*/metrics.jsonl")):
    name = path.split("/")[-2]; loss, val = {}, []
    for line in open(path):
        try: m = json.loads(line)
        except Exception: continue
        if "loss" in m and "step" in m: loss[m["step"]] = m["loss"]
        if "val_loss" in m: val.append((m["step"], m["val_loss"]))
    last = max(loss) if loss else 0; pts = []
    for s in range(250, last + 1, 250):
        w = [loss[i] for i in range(s - 49, s + 1) if i in loss]; pts.append("%d:%.3f" % (s, sum(w) / len(w)))
    print(f"{name:20s} last {last} max {max(loss.values()) if loss else 0:.2f} " + " ".join(pts))
    if val: print(f"{'':20s} val " + " ".join("%d:%.3f" % v for v in val))
PY
}
alive() { for p in "${pids[@]}"; do kill -0 $p 2>/dev/null && return 0; done; return 1; }
while alive; do sleep 20; summarize; done
summarize; cat $OUT/lm5_summary.txt; tail -3 /tmp/lm5/mxfp4_head_bf16_s1.log
