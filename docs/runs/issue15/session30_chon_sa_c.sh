#!/bin/bash
# Session 30, call C (same x4 machine, right after B; carry ["devpackc", "data/fortunes_train.bin"]):
# the SA runs continue from their checkpoints; current main's nn_cuda_test and trainer_parity_test
# beside them on GPU 0; each GPU, once its SA run is done, takes GPT learning-rate probe runs
# (issue 14) from a shared queue; the SA report when all four SA runs are done.
#   bash c2.sh DEADLINE
set -u
deadline=$1; start=$(date +%s)
left() { echo $(( deadline - ($(date +%s) - start) )); }
export KEEL_TRAIN=/tmp/k/dist/bin/keel-train LD_LIBRARY_PATH=/tmp/k/dist/lib
mkdir -p /tmp/m && python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpackc/m.txz')).extractall('/tmp/m')"
sa() {  # gpu scheme
  CUDA_VISIBLE_DEVICES=$1 scripts/reproduce-chon run --train /tmp/corpus/corpus_train.bin \
    --val /tmp/corpus/corpus_val.bin --size d512L8 --tokens 200e6 --models sa --schemes $2 \
    --work /tmp/chon-$2 --out /tmp/co-$2 --deadline-s $(( $(left) - 45 )) > /tmp/hc-$2.log 2>&1
  touch /tmp/sa-done-$2
}
cat > /tmp/gpt.yaml <<'Y'
name: gpt-lr-probe
model: {type: gpt, layers: 8, width: 512, heads: 8, context: 1024, vocab: 50257, padded_vocab: 50304}
data: {train: /tmp/corpus/corpus_train.bin, val: /tmp/corpus/corpus_val.bin, eval_every: 0}
precision: bf16
batch: 16
seq: 1024
steps: 3000
seed: 1
optimizer: {type: adamw, lr: 1.0e-3, beta2: 0.95, weight_decay: 0.1, grad_clip: 1.0}
schedule: {type: cosine, warmup_steps: 60, min_lr_ratio: 0.1}
backend: cuda
checkpoint_every: 0
probe_every: 0
log_every: 10
Y
printf '%s\n' "6e-3 mxfp8_e4m3" "6e-3 mxfp4" "2e-2 mxfp8_e4m3" "2e-2 mxfp4" "6e-3 bf16" "2e-3 mxfp8_e4m3" \
  "2e-3 mxfp4" "1e-2 mxfp8_e4m3" "1e-2 mxfp4" "2e-2 bf16" "1e-2 bf16" "2e-3 bf16" > /tmp/probe-queue
probe_one() {  # gpu lr scheme
  local d=/tmp/probe-$2-$3 t=$(( $(left) - 25 )); [ $t -lt 30 ] && return
  CUDA_VISIBLE_DEVICES=$1 LD_LIBRARY_PATH=/tmp/m/dist/lib timeout $t /tmp/m/dist/bin/keel-train --config /tmp/gpt.yaml \
    --quiet --run-dir $d --set optimizer.lr=$2 --set precision=$3 > $d.log 2>&1
  python3 - "$d" "$2" "$3" >> $OUT/probe.txt <<'P'
import json, sys
d, lr, scheme = sys.argv[1:]
L = [json.loads(l) for l in open(d + "/metrics.jsonl")]
xs = [(m["step"], m["loss"]) for m in L if isinstance(m.get("loss"), (int, float))]
lo = min(xs, key=lambda x: x[1]) if xs else (0, float("nan"))
after = max((l for s, l in xs if s > lo[0]), default=float("nan"))
print(f"lr {lr} {scheme}: steps {xs[-1][0] if xs else 0}, lowest {lo[1]:.3f} at {lo[0]}, "
      f"highest after it {after:.3f}, last {xs[-1][1] if xs else float('nan'):.3f}, "
      f"blew up {after > 1.5 * lo[1]}")
P
}
probes() {  # gpu: take jobs from the queue until it is empty
  while true; do
    local job=$(flock /tmp/probe-queue sh -c 'head -1 /tmp/probe-queue; sed -i 1d /tmp/probe-queue')
    [ -z "$job" ] && return
    probe_one $1 $job
  done
}
(cd /work 2>/dev/null; true)
(CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/tmp/m/dist/lib timeout 240 /tmp/m/dist/bin/nn_cuda_test > /tmp/nn.txt 2>&1
 echo "nn_cuda_test rc=$?" > $OUT/tests.txt; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" /tmp/nn.txt >> $OUT/tests.txt
 CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/tmp/m/dist/lib timeout 300 /tmp/m/dist/bin/trainer_parity_test > /tmp/parity.txt 2>&1
 echo "trainer_parity_test rc=$?" >> $OUT/tests.txt; grep -E "^(gpt|llama|gla|proxy)|^\[  (PASSED|FAILED)|FAILED  \]" /tmp/parity.txt >> $OUT/tests.txt
 tar cf - -C /tmp nn.txt parity.txt | xz > $OUT/tests.tar.xz) &
(sa 0 bf16; probes 0) & (sa 1 nvfp4_recipe; probes 1) & (sa 2 chon; probes 2) & (sa 3 nvfp4_hcp; probes 3) &
(while [ ! -e /tmp/sa-done-bf16 ] || [ ! -e /tmp/sa-done-chon ] || [ ! -e /tmp/sa-done-nvfp4_recipe ] || [ ! -e /tmp/sa-done-nvfp4_hcp ]; do sleep 5; done
 mkdir -p /tmp/sa && cp /tmp/chon-bf16/base.yaml /tmp/sa/
 for r in /tmp/chon-*/sa-*; do ln -sfn $r /tmp/sa/; done
 timeout 60 scripts/reproduce-chon report --work /tmp/sa --out /tmp/sa-report > /tmp/report.log 2>&1
 cp /tmp/sa-report/summary.md /tmp/sa-report/runs.json /tmp/sa-report/curves.json $OUT/
 tar cf - -C /tmp/sa-report plots report.log 2>/dev/null | xz > $OUT/sa-plots.tar.xz; cp /tmp/report.log $OUT/ 2>/dev/null
 for r in /tmp/sa/sa-*; do echo "$(basename $r) $(tail -1 $r/metrics.jsonl | cut -c1-60) $(ls $r/DONE 2>/dev/null)"; done > $OUT/sa-state.txt) &
wait
cat $OUT/tests.txt $OUT/sa-state.txt $OUT/probe.txt 2>/dev/null
