#!/bin/bash
# Session 33, call 1 (kind nvidia-h200, NAMED: one GPU, counts half; carry ["devpack33a",
# "data/fortunes_train.bin"]). Main's checks, branch analytics-bf16 (devpack33a/v.txz, V_COMMIT) against
# main, and the quantized schemes' per-op profiles for the next speed work (issue 12).
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack33a/a.txz')).extractall('/tmp/k')"
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack33a/v.txz')).extractall('/tmp')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "main $(cat devpack33a/COMMIT) branch $(cat devpack33a/V_COMMIT)"; } > $OUT/gpu.txt
# 1. The branch: its two new cases and the analytics ones, then the whole nn_cuda_test; parity Gpt.
{ timeout 200 /tmp/v/nn_cuda_test > /tmp/nnv.txt 2>&1; echo "branch nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Bf16InPlace|Bf16Operands" /tmp/nnv.txt
  timeout 120 /tmp/v/trainer_parity_test --gtest_filter='*Gpt*' > /tmp/parv.txt 2>&1; echo "branch parity rc=$?"
  grep -E "^gpt |OK \]|FAILED" /tmp/parv.txt
} > $OUT/branch_checks.txt 2>&1
# 2. Analytics cost and peak, main then branch (the branch should drop the +3.97 GiB of the bf16 step).
{ for v in main branch; do
    bin=$B/train_bench; [ $v = branch ] && bin=/tmp/v/train_bench
    timeout 150 $bin --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --analytics 100 2>&1 | grep -E "ms/step|every" | sed "s#^#$v #"
    timeout 60 $bin --only proxy --steps 20 --schemes mxfp8_e4m3 --analytics 100 2>&1 | grep -E "ms/step|every" | sed "s#^#$v #"
  done
} > $OUT/analytics_main_vs_branch.txt 2>&1
# 3. Main: nn_cuda_test (the merged head chunks default to 1 GiB now) and parity Llama.
{ timeout 150 $B/nn_cuda_test > /tmp/nn.txt 2>&1; echo "main nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" /tmp/nn.txt
  timeout 100 $B/trainer_parity_test --gtest_filter='*Llama*' > /tmp/par.txt 2>&1; echo "main parity rc=$?"
  grep -E "OK \]|FAILED" /tmp/par.txt
} > $OUT/main_checks.txt 2>&1
cat $OUT/branch_checks.txt $OUT/analytics_main_vs_branch.txt $OUT/main_checks.txt
