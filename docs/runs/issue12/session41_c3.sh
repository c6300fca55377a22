#!/bin/bash
# Session 41, call 3 (one GPU): cudnn_attention with the system's cuDNN (the one llm.c is built with).
# Prepare: scripts/dist --pack pack/dist.txz --only //kernels:nn_cuda_test //bench:train_bench
# //worker/engine:trainer_parity_test; scripts/fetch-llmc .llmc; scripts/prepare-fortunes; stash the series;
# cp this file to the repository root; carry ["pack", ".llmc", "data"].
#   1. nn_cuda_test CudnnAttentionForwardMatchesCpu (6e-3 on out when cuDNN ran).
#   2. trainer_parity_test Gpt and Llama (lockstep against the CPU) with KEEL_CUDA_ON=cudnn_attention.
#   3. bench/speed --llmc with KEEL_CUDA_ON=cudnn_attention (Keel and llm.c in one run, both on this cuDNN).
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)";
  ldconfig -p | grep -m2 libcudnn.so; } > $OUT/gpu.txt
timeout 60 $B/nn_cuda_test --gtest_filter='*CudnnAttention*' > $OUT/cudnn_test.txt 2>&1
echo "cudnn test rc=$?" >> $OUT/cudnn_test.txt
export KEEL_CUDA_ON=cudnn_attention
timeout 200 $B/trainer_parity_test --gtest_filter='*Gpt:*Llama*' > $OUT/parity.txt 2>&1
echo "parity rc=$?" >> $OUT/parity.txt
timeout 300 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > $OUT/speed.log 2>&1
echo "speed rc=$?" >> $OUT/speed.log
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
grep -E "OK|FAILED|normwise|rc=|ran on" $OUT/cudnn_test.txt | head -20
grep -E "OK \]|FAILED|rc=" $OUT/parity.txt
tail -16 $OUT/speed_summary.txt 2>/dev/null; tail -3 $OUT/speed.log
echo "seconds $SECONDS"
