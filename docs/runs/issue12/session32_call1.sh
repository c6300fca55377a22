#!/bin/bash
# Session 32, call 1 (kind nvidia-h200 or nvidia-h100-x1: ONE GPU, counts half; NAME THE KIND;
# carry ["devpack32a", "data/fortunes_train.bin", ".llmc"]). Current main's checks and the figures
# that close or advance issues 15 and 12. Each result is written to $OUT as soon as it exists.
#  1. outlier analytics' cost at the proxy and GPT-2 124M after the linear-time summaries (issue 15:
#     the proxy must be < 3%); outliers_bench on this host
#  2. nn_cuda_test (the profiler's host timing touched nn_cuda_backend.cu), trainer_parity_test Proxy+Gpt
# bench/speed is call 1b (c1b.sh), so that neither call nears the 600 s limit.
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack32a/a.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
cat devpack32a/COMMIT >> $OUT/gpu.txt
{ $B/outliers_bench
  for i in 1 2; do timeout 90 $B/train_bench --only proxy --steps 20 --analytics 100 2>&1 | grep -E "ms/step|every"; done
  timeout 120 $B/train_bench --only proxy --steps 20 --analytics 100 --profile 2>&1 | grep -E "every|outside|all ops|step \(wall|Summar|profile of"
  timeout 200 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --analytics 100 2>&1 | grep -E "ms/step|every"
} > $OUT/analytics.txt 2>&1
# The GPT-2 124M bf16 step's per-op profile with host times (is any of it host-bound?).
timeout 120 $B/train_bench --only gpt --steps 10 --schemes bf16 --profile > $OUT/gpt_profile.txt 2>&1
{ timeout 200 $B/nn_cuda_test > /tmp/nn.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" /tmp/nn.txt
  timeout 150 $B/trainer_parity_test --gtest_filter='*Gpt*:*Proxy*' > /tmp/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "OK \]|FAILED" /tmp/parity.txt
} > $OUT/checks.txt 2>&1
cat $OUT/analytics.txt $OUT/checks.txt; grep -E "outside|all ops|step \(wall" $OUT/gpt_profile.txt
