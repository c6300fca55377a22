#!/bin/bash
# Session 38, call 1 (kind nvidia-h200-x2 or a 4-GPU kind, NAMED; carry ["devpack38a", "devpack38s", ".llmc"]; move
# docs/runs/issue14/*-series.csv.xz out of the tree first (carry limit), back after). Build: main (held weight merged).
# GPU 0: the kept attention heads' checks (nn_cuda_test, GPT parity) and A/B (KEEL_CUDA_OFF=kept_heads), then
# bench/speed against llm.c (issue 12's line) and a bf16/MXFP8 profile.
# GPU 1: today's preset at lr 3e-4, depths 3-4, seed 1, policy runs only (18; twins: session 34's grid g) and one whole
# cell (depth 8, width 512, lr 3e-4, E2M3: where grid g8's unprotected run blew up) to check this build against grid g8.
# With 4 GPUs, GPUs 2-3 also run call 2's grids (depths 6-8 at lr 3e-4, and the 3 pairs session 37's deadline cut).
# ONE tarball back ($OUT/c1.tgz).
set -u
O=$OUT; OUT=/tmp/o1; mkdir -p $OUT /tmp/k data
python3 -c "import lzma,tarfile
for p in ('devpack38a/a.txz', 'devpack38s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
xz -dc devpack38a/fortunes_train.bin.xz > data/fortunes_train.bin
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
NG=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack38a/COMMIT)"; } > $OUT/gpu.txt
grid() {  # name, port, gpus, deadline, gen args...
  local n=$1 port=$2 gpus=$3 dl=$4; shift 4
  python3 scripts/policy-grid gen --name $n "$@" -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --port $port --deadline-s $dl --worker-args "--gpus $gpus" > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
}
grid grid-l-lr3e-4-d34-seed1 7391 1 520 --layers 3,4 --widths 256,384,512 --lrs 3e-4 --seeds 1 --policy-only --gpus 0.045 & P1=$!
grid grid-l-check-d8w512-lr3e-4 7392 1 520 --layers 8 --widths 512 --lrs 3e-4 --seeds 1 --formats mxfp6_e2m3 --gpus 0.045 & P2=$!
PIDS="$P1 $P2"
if [ "$NG" -ge 4 ]; then
  grid grid-l6-lr3e-4-seed1 7393 2 520 --layers 6 --widths 256,384,512 --lrs 3e-4 --seeds 1 --policy-only --gpus 0.1 & PIDS="$PIDS $!"
  grid grid-l8-lr3e-4-seed1 7394 3 520 --layers 8 --widths 256,384,512 --lrs 3e-4 --seeds 1 --policy-only --gpus 0.08 & PIDS="$PIDS $!"
  grid grid-l8-w512-lr6e-4-seed1 7395 3 520 --layers 8 --widths 512 --lrs 6e-4 --seeds 1 --policy-only --gpus 0.08 & PIDS="$PIDS $!"
fi
export CUDA_VISIBLE_DEVICES=0
# The kept attention heads (branch attn-kept-heads, if the packs were built from it: devpack38a/COMMIT): its new
# nn_cuda_test (AttentionKeptHeadsGiveTheBitsOfTheUnkeptPair), the GPT and Llama parity (both models keep the heads
# now), and the A/B in one binary.
{ timeout 120 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/nn_cuda_test.txt
  grep -E "^\[ +(OK|FAILED) +\] NnCudaTest\.(AttentionKept|AttentionMatchesCpu|KeelCudaOff)" $OUT/nn_cuda_test.txt
  timeout 200 $B/trainer_parity_test --gtest_filter='*Gpt*:*Llama*' > $OUT/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|llama) |OK \]|FAILED" $OUT/parity.txt
} > $OUT/checks.txt 2>&1
for mode in on off on off; do
  if [ $mode = off ]; then export KEEL_CUDA_OFF=kept_heads; else unset KEEL_CUDA_OFF; fi
  echo "== kept_heads $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step"
done > $OUT/kept_ab.txt 2>&1
unset KEEL_CUDA_OFF
timeout 200 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
cp /tmp/speed.log $OUT/speed.log
[ $SECONDS -lt 470 ] && timeout 90 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --profile > $OUT/profile.txt 2>&1
unset CUDA_VISIBLE_DEVICES
wait $PIDS
tar -C /tmp -czf $O/c1.tgz o1
cat $OUT/checks.txt $OUT/kept_ab.txt; tail -8 $OUT/speed_summary.txt; for f in $OUT/grid-*-run.log; do echo "$f: $(tail -2 $f | head -1)"; done
