#!/bin/bash
# Session 31, call E (one GPU; carry ["devpack31e"]): (1) the proxy's outlier analytics cost
# with train_bench's new host column (built from main at 32711c3: the three branches merged, host times in the profile); (2) why the
# GPT slice's MX runs stall at lr 1.5e-3: seven unprotected runs of the slice's config (on the first 100 MB of corpus part 00 only: the carry limit) side by
# side on one GPU, stopped by timeout (metrics.jsonl is written per step).
set -u
mkdir -p /tmp/k /tmp/corpus /tmp/lm
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack31e/a.txz')).extractall('/tmp/k')"
cp devpack31e/train.00.txt.xz devpack31e/val.txt.xz /tmp/corpus/
xz -dc devpack31e/train_bench.xz > /tmp/train_bench && chmod +x /tmp/train_bench
export LD_LIBRARY_PATH=/tmp/k/dist/lib
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
(python3 scripts/prepare-corpus --tokenize-only /tmp/corpus --keel-train /tmp/k/dist/bin/keel-train \
   --bpe-dir /tmp/k/bpe > /tmp/tok.txt 2>&1; echo "tokenize rc=$?" >> /tmp/tok.txt) &
{ timeout 120 /tmp/train_bench --only proxy --steps 20 --analytics 100 --profile 2>&1 | tail -80
  for i in 1 2; do timeout 60 /tmp/train_bench --only proxy --steps 20 --analytics 100 2>&1 | grep -E "ms/step|every"; done
} > $OUT/analytics_host.txt 2>&1
wait
tail -2 /tmp/tok.txt > $OUT/tokenize.txt
mkdir -p data && cp /tmp/corpus/corpus_train.bin /tmp/corpus/corpus_val.bin data/
run() {  # name, --set overrides...
  local name=$1; shift
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  timeout ${LM_S:-330} /tmp/k/dist/bin/keel-train --config devpack31e/lm.yaml --run-dir /tmp/lm/$name --quiet "${sets[@]}" \
    > /tmp/lm/$name.log 2>&1
}
run bf16 precision=bf16 &
run mxfp8 &
run mxfp8_ln_bf16 precision.layernorm=bf16 &
run mxfp8_head_bf16 precision.bf16_head=true &
run mxfp8_ln_head_bf16 precision.layernorm=bf16 precision.bf16_head=true &
run mxfp8_bwd_e5m2 precision=mxfp8_e4m3_bwd_e5m2 &
run mxfp4_ln_head_bf16 precision=mxfp4 precision.layernorm=bf16 precision.bf16_head=true &
sleep 60; nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader >> $OUT/gpu.txt
wait
python3 - > $OUT/lm_summary.txt <<'PY'
import json, glob, os
print("run: mean training loss over the 50 steps ending at each step; last step; val losses (step: loss)")
for path in sorted(glob.glob("/tmp/lm/*/metrics.jsonl")):
    name = path.split("/")[-2]
    loss, val = {}, []
    for line in open(path):
        try: m = json.loads(line)
        except Exception: continue
        if "loss" in m and "step" in m: loss[m["step"]] = m["loss"]
        for k in ("val_loss", "eval_loss"):
            if k in m: val.append((m["step"], m[k]))
    last = max(loss) if loss else 0
    pts = []
    for s in range(100, last + 1, 100):
        w = [loss[i] for i in range(s - 49, s + 1) if i in loss]
        pts.append("%d:%.3f" % (s, sum(w) / len(w)))
    print(f"{name:20s} last {last} " + " ".join(pts))
    print(f"{'':20s} val " + " ".join("%d:%.3f" % v for v in val))
PY
tar cf - -C /tmp/lm . | xz -T8 > $OUT/lm_runs.tar.xz
cat $OUT/lm_summary.txt; grep -E "every|outside|all ops|step \(wall" $OUT/analytics_host.txt
