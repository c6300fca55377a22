#!/bin/bash
# Session 39, call 1 (a 4-GPU kind, NAMED; carry ["devpack39a", "devpack39s", "devpack39b", "devpack39c"]).
# GPU 0: branch bf16-head-chunked-backward (devpack39b/COMMIT; main's binaries in devpack39a): nn_cuda_test whole (new:
#   AHeldBf16WeightServesEveryChunksBackwardAndGoesWithTheHold), trainer_parity_test Gpt/GptHeadInChunks/Llama, and
#   the A/B main vs branch train_bench (bf16, mxfp8_e4m3; B16 and bf16 B32): ms/step and peak MiB. Then branch
#   cudnn-sdpa (devpack39c): nn_cuda_test CudnnAttentionForwardMatchesCpu (with cuDNN's logs on failure) and its A/B
#   (train_bench bf16 / mxfp8 with KEEL_CUDNN=1 against without, in its own binary).
# GPUs 1-3: issue 14 seed 2, one whole sweep a GPU (SPECS below, as cseed.sh). GPUs 2-3's sweeps run under CUDA MPS
# (a user-level daemon, started here and quit at the end; no GPU setting changes), GPU 1's without: the proxy's small
# kernels from 21 processes time-slice without MPS (12 runs a GPU took 220-403 s: about 2.5x one run's step time), and
# with MPS they may run side by side. GPU 2 also reruns grid k-check-d3w512's whole cell (seed 1) under MPS: its plain
# run must blow up at 7030 and end at 0.04833713481937454 as before (determinism under MPS).
# ONE tarball back ($OUT/c1.tgz).
set -u
SEED=${SEED:-2}
SPECS=${SPECS:-"3:3e-4:256,384,512 3:6e-4:256,384,512 3:1e-3:256,384,512"}
O=$OUT; OUT=/tmp/o1; mkdir -p $OUT /tmp/k /tmp/kb data
python3 -c "import lzma,tarfile
for p, d in (('devpack39a/a.txz', '/tmp/k'), ('devpack39s/s.txz', '/tmp/k'), ('devpack39b/b.txz', '/tmp/kb'),
             ('devpack39c/c.txz', '/tmp/kc')):
    tarfile.open(fileobj=lzma.open(p)).extractall(d)"
xz -dc devpack39a/fortunes_train.bin.xz > data/fortunes_train.bin
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin; BB=/tmp/kb/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "main $(cat devpack39a/COMMIT) branch $(cat devpack39b/COMMIT)"; } > $OUT/gpu.txt
MPS_PIPE=/tmp/mps-pipe; mkdir -p $MPS_PIPE /tmp/mps-log
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log nvidia-cuda-mps-control -d > $OUT/mps.txt 2>&1
echo "mps-control rc=$?" >> $OUT/mps.txt
PIDS=""; g=1
for spec in $SPECS; do
  if [ $g -ge 2 ]; then export CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE; else unset CUDA_MPS_PIPE_DIRECTORY; fi
  IFS=: read -r L LR W <<< "$spec"
  n=grid-n$L-lr$LR-w${W//,/-}-seed$SEED
  runs=$(( 7 * $(echo "$W" | tr ',' '\n' | wc -l) ))
  share=$(python3 -c "print(min(0.25, int(1000 / $runs) / 1000))")
  ( python3 scripts/policy-grid gen --name $n --layers $L --widths $W --lrs $LR --seeds $SEED --gpus $share -o /tmp/$n.yaml \
      && cp /tmp/$n.yaml $OUT/ \
      && python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
           --port $((7391 + g)) --deadline-s 530 --worker-args "--gpus $g" > $OUT/$n-run.log 2>&1
    echo "rc=$?" >> $OUT/$n-run.log ) & PIDS="$PIDS $!"
  g=$((g + 1))
done
( export CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE; n=grid-mps-check-d3w512
  python3 scripts/policy-grid gen --name $n --layers 3 --widths 512 --lrs 1e-3 --seeds 1 --formats mxfp8_e4m3 --gpus 0.045 -o /tmp/$n.yaml \
    && cp /tmp/$n.yaml $OUT/ && python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
      --port 7399 --deadline-s 530 --worker-args "--gpus 2" > $OUT/$n-run.log 2>&1; echo "rc=$?" >> $OUT/$n-run.log ) & PIDS="$PIDS $!"
unset CUDA_MPS_PIPE_DIRECTORY
export CUDA_VISIBLE_DEVICES=0
{ timeout 150 $BB/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/nn_cuda_test.txt
  grep -E "^\[ +(OK|FAILED) +\] NnCudaTest\.AHeld" $OUT/nn_cuda_test.txt
  timeout 220 $BB/trainer_parity_test --gtest_filter='*Gpt*:*Llama*' > $OUT/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|llama) |OK \]|FAILED" $OUT/parity.txt
} > $OUT/checks.txt 2>&1
for i in 1 2; do
  for bin in $B $BB; do
    echo "== $bin"
    timeout 60 $bin/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step"
    timeout 60 $bin/train_bench --only gpt --steps 10 --batch 32 --schemes bf16 2>&1 | grep "ms/step"
  done
done > $OUT/head_ab.txt 2>&1
BC=/tmp/kc/dist/bin
{ echo "cudnn-sdpa $(cat devpack39c/COMMIT)"; ls /usr/lib/x86_64-linux-gnu/libcudnn.so* 2>&1 | head -3
  CUDNN_LOGERR_DBG=1 CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr timeout 120 $BC/nn_cuda_test --gtest_filter='*Cudnn*:*AttentionMatchesCpu*' 2>&1 | tail -40
  for mode in 1 0 1 0; do
    echo "== KEEL_CUDNN=$mode"
    KEEL_CUDNN=$mode timeout 60 $BC/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep -E "ms/step|cuDNN"
  done
  KEEL_CUDNN=1 timeout 60 $BC/train_bench --only gpt --steps 10 --schemes bf16 --profile 2>&1 | grep -E "Attention|step \(wall"
} > $OUT/cudnn.txt 2>&1
unset CUDA_VISIBLE_DEVICES
wait $PIDS
echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS_PIPE nvidia-cuda-mps-control >> $OUT/mps.txt 2>&1
cp /tmp/mps-log/* $OUT/ 2>/dev/null; nvidia-smi -q -d COMPUTE | grep -i "compute mode" >> $OUT/mps.txt
tar -C /tmp -czf $O/c1.tgz o1
cat $OUT/checks.txt $OUT/head_ab.txt; tail -25 $OUT/cudnn.txt; for f in $OUT/grid-*-run.log; do echo "$f: $(tail -2 $f | head -1)"; done
