#!/bin/bash
# Session 41, call 6 (one GPU): the final build's nn_cuda_test whole, then bench/speed with both cuDNN switches on
# (cudnn_attention,cudnn_attention_bwd; the system's cuDNN for Keel and llm.c). Prepare: scripts/dist --pack
# pack/dist.txz --only //kernels:nn_cuda_test //bench:train_bench; scripts/fetch-llmc .llmc; stash the series;
# cp this file to the repository root; carry ["pack", ".llmc"].
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)"; } > $OUT/gpu.txt
timeout 120 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/nn_cuda_test.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=|normwise|tests from" $OUT/nn_cuda_test.txt | tail -12
export KEEL_CUDA_ON=cudnn_attention,cudnn_attention_bwd
timeout 300 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > $OUT/speed.log 2>&1
echo "speed rc=$?" >> $OUT/speed.log
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
tail -16 $OUT/speed_summary.txt 2>/dev/null; tail -2 $OUT/speed.log
echo "seconds $SECONDS"
