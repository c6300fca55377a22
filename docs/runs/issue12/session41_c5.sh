#!/bin/bash
# Session 41, call 5 (one GPU): KEEL_CUDA_ON=cudnn_attention_bwd's first run (cuDNN's SDPA backward, the
# deterministic dQ variant), with the system's cuDNN. Prepare: scripts/dist --pack pack/dist.txz --only
# //kernels:nn_cuda_test //bench:train_bench //worker/engine:trainer_parity_test; scripts/prepare-fortunes;
# stash the series; cp this file to the repository root; carry ["pack", "data"].
#   1. nn_cuda_test CudnnAttentionMatchesCpu (forward, backward, both), cuDNN's warnings logged.
#   2. trainer_parity_test Gpt and Llama with KEEL_CUDA_ON=cudnn_attention_bwd (the forward stays Keel's).
#   3. train_bench A/B: off, bwd, fwd+bwd, off, bwd, fwd+bwd (bf16, mxfp8_e4m3), and a profile with bwd.
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)"; } > $OUT/gpu.txt
CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=/tmp/cudnn_log.txt timeout 150 $B/nn_cuda_test \
  --gtest_filter='*CudnnAttention*' > $OUT/cudnn_test.txt 2>&1
echo "cudnn test rc=$?" >> $OUT/cudnn_test.txt
grep -v "CUDNN_STATUS_SUCCESS; Reason: cuDNN Library configuration" /tmp/cudnn_log.txt | tail -c 12000 > $OUT/cudnn_log_tail.txt
KEEL_CUDA_ON=cudnn_attention_bwd timeout 200 $B/trainer_parity_test --gtest_filter='*Gpt:*Llama*' > $OUT/parity.txt 2>&1
echo "parity rc=$?" >> $OUT/parity.txt
for mode in off cudnn_attention_bwd cudnn_attention,cudnn_attention_bwd off cudnn_attention_bwd cudnn_attention,cudnn_attention_bwd; do
  echo "== $mode" >> $OUT/ab.txt
  if [ $mode = off ]; then unset KEEL_CUDA_ON; else export KEEL_CUDA_ON=$mode; fi
  timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep -E "ms/step|keel:" >> $OUT/ab.txt
done
KEEL_CUDA_ON=cudnn_attention_bwd timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16 --profile > $OUT/profile.txt 2>&1
grep -E "OK|FAILED|normwise|rc=|Failure|Expected|actual" $OUT/cudnn_test.txt | head -60
grep -E "^(gpt|llama) |OK \]|FAILED \]|rc=" $OUT/parity.txt
cat $OUT/ab.txt | cut -c1-120
grep -E "Attention|step \(wall" $OUT/profile.txt
echo "seconds $SECONDS"
