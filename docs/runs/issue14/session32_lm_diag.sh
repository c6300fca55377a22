#!/bin/bash
# Session 32, call 2 (kind nvidia-h200-x4, NAMED; carry ["devpack32b"]: keel-train + libs + BPE,
# the first 100 MB of corpus part 00, val, lm.yaml). Issue 14: why MX trains so badly on the GPT at
# lr 1.5e-3 (docs/reproductions/policy-grid.md, session 31). Eight unprotected runs of the slice's
# config, two per GPU, 3000 steps (the same cosine schedule), on part 00 only (the carry limit).
# The summary is rewritten to $OUT every 60 s, so a cut-off call still returns it.
set -u
mkdir -p /tmp/k /tmp/corpus /tmp/lm
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack32b/a.txz')).extractall('/tmp/k')"
cp devpack32b/train.00.txt.xz devpack32b/val.txt.xz /tmp/corpus/
export LD_LIBRARY_PATH=/tmp/k/dist/lib
python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
  --bpe-dir /tmp/k/bpe 2>&1 | tail -2 > $OUT/tokenize.txt
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
run() {  # gpu, name, --set overrides...
  local gpu=$1 name=$2; shift 2
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  CUDA_VISIBLE_DEVICES=$gpu timeout ${LM_S:-500} /tmp/k/dist/bin/keel-train --config devpack32b/lm.yaml \
    --run-dir /tmp/lm/$name --quiet "${sets[@]}" > /tmp/lm/$name.log 2>&1 &
  pids+=($!)
}
pids=()
run 0 bf16 precision=bf16
run 0 mxfp8
run 1 mxfp8_ln_bf16 precision.layernorm=bf16
run 1 mxfp8_head_bf16 precision.bf16_head=true
run 2 mxfp8_ln_head_bf16 precision.layernorm=bf16 precision.bf16_head=true
run 2 mxfp8_bwd_e5m2 precision=mxfp8_e4m3_bwd_e5m2
run 3 bf16_lr6e-4 precision=bf16 optimizer.lr=6e-4
run 3 mxfp8_lr6e-4 optimizer.lr=6e-4
summarize() {
python3 - > $OUT/lm_summary.txt <<'PY'
import json, glob
print("run: mean training loss over the 50 steps ending at each 250th step; val (step: loss); every third probe (step: zeta/cosine)")
for path in sorted(glob.glob("/tmp/lm/*/metrics.jsonl")):
    name = path.split("/")[-2]
    loss, val, probes = {}, [], []
    for line in open(path):
        try: m = json.loads(line)
        except Exception: continue
        if "loss" in m and "step" in m: loss[m["step"]] = m["loss"]
        for k in ("val_loss", "eval_loss"):
            if k in m: val.append((m["step"], m[k]))
        if isinstance(m.get("probe"), dict):
            probes.append((m["step"], m["probe"].get("zeta"), m["probe"].get("cosine")))
    last = max(loss) if loss else 0
    pts = []
    for s in range(250, last + 1, 250):
        w = [loss[i] for i in range(s - 49, s + 1) if i in loss]
        pts.append("%d:%.3f" % (s, sum(w) / len(w)))
    print(f"{name:20s} last {last} " + " ".join(pts))
    if val: print(f"{'':20s} val " + " ".join("%d:%.3f" % v for v in val))
    if probes: print(f"{'':20s} probe zeta/cosine " + " ".join("%d:%.3f/%.3f" % (st, z or 0, c or 0) for st, z, c in probes[::3]))
PY
}
alive() { for p in "${pids[@]}"; do kill -0 $p 2>/dev/null && return 0; done; return 1; }
while alive; do sleep 60; summarize; done
wait
summarize; cat $OUT/lm_summary.txt
