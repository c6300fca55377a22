#!/bin/bash
# Session 34, call 1 (kind nvidia-h200, NAMED; carry ["devpack34a", "data/fortunes_train.bin"]):
# main's GPU checks (nn_cuda_test with session 33's amended OutlierReductionsReadBf16InPlaceWithTheWidenedBits,
# parity), then the policy snapshots' cost in memory and on disk (train_bench --snapshots).
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack34a/a.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "main $(cat devpack34a/COMMIT)"; } > $OUT/gpu.txt
{ timeout 170 $B/nn_cuda_test > /tmp/nn.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Bf16InPlace" /tmp/nn.txt
  timeout 150 $B/trainer_parity_test --gtest_filter='*Gpt*:*Proxy*' > /tmp/par.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|proxy) |OK \]|FAILED" /tmp/par.txt
} > $OUT/checks.txt 2>&1
cp /tmp/nn.txt $OUT/nn_cuda_test.txt
# The policy's snapshots: in memory (session 33's change) against a checkpoint on disk (before), each
# amortized over 100 steps, at GPT-2 124M and the proxy (issue 14's overhead).
{ timeout 120 $B/train_bench --only gpt --steps 5 --schemes bf16,mxfp8_e4m3 --snapshots 100 2>&1 | grep -E "ms/step|snapshots"
  timeout 90 $B/train_bench --only proxy --steps 2 --snapshots 100 2>&1 | grep -E "ms/step|snapshots"
} > $OUT/snapshots.txt 2>&1
cat $OUT/checks.txt $OUT/snapshots.txt
