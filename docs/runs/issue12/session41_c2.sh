#!/bin/bash
# Session 41, call 2 (one GPU): KEEL_CUDA_ON=cudnn_attention's first run (cuDNN's SDPA forward through
# the backend API, nn_cuda_cudnn.cu). Prepare: scripts/dist --pack pack/dist.txz --only //kernels:nn_cuda_test
# //bench:train_bench; cp this file to the repository root; carry ["pack"].
#   1. nn_cuda_test CudnnAttentionForwardMatchesCpu (cuDNN's warnings and errors logged), then the whole binary.
#   2. train_bench A/B (off, on, off, on): gpt2-124m bf16 and mxfp8_e4m3 at B16, ms/step and peak.
#   3. train_bench --profile with cudnn_attention on, bf16 (where the attention's time went).
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null)
export LD_LIBRARY_PATH=/tmp/k/dist/lib:$(ls -d $SP/nvidia/*/lib 2>/dev/null | tr '\n' ':')${LD_LIBRARY_PATH:-}
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)";
  ldconfig -p | grep -m3 libcudnn.so; ls $SP/nvidia/cudnn/lib 2>/dev/null | head -3; } > $OUT/gpu.txt
CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=$OUT/cudnn_log.txt timeout 120 $B/nn_cuda_test \
  --gtest_filter='*CudnnAttention*' > $OUT/cudnn_test.txt 2>&1
echo "cudnn test rc=$?" >> $OUT/cudnn_test.txt
tail -c 20000 $OUT/cudnn_log.txt > $OUT/cudnn_log_tail.txt 2>/dev/null; rm -f $OUT/cudnn_log.txt
timeout 150 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/nn_cuda_test.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|rc=" $OUT/nn_cuda_test.txt > $OUT/checks.txt
for mode in off on off on; do
  echo "== cudnn_attention $mode" >> $OUT/ab.txt
  if [ $mode = on ]; then export KEEL_CUDA_ON=cudnn_attention; else unset KEEL_CUDA_ON; fi
  timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep -E "ms/step|keel:" >> $OUT/ab.txt
done
KEEL_CUDA_ON=cudnn_attention timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16 --profile > $OUT/profile.txt 2>&1
cat $OUT/cudnn_test.txt | grep -E "OK|FAILED|normwise|Failure|cuDNN|rc=|Expected|Which|Value" | head -40
cat $OUT/checks.txt $OUT/ab.txt
grep -E "Attention|step \(wall" $OUT/profile.txt
echo "seconds $SECONDS"
