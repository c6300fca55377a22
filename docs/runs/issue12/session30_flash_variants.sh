#!/bin/bash
# Planned in session 29 (no device time was left to run it); devpack/fv.txz holds the binaries: the fused attention's
# occupancy variants of branch flash-occupancy and the half-row cross-entropy of branch
# ce-split-row against main, in one call. /tmp/pk/{main,v1,v2,v3} hold nn_cuda_test and
# train_bench built at main (25613e6), at f24fe16 (the forward with one 16-row MMA tile per
# warp), at 826d9f6 (plus the backward kernels' launch bounds) and at the head of ce-split-row (the half-row copy and the unrolled RowMaxSum);
# v4 and v5 (nn_cuda_test only) are main with one launch bound each, to tell their effects
# apart: v4 __launch_bounds__(kBlockThreads, 4) on FlashDqKernel, v5 (kBlockThreads, 3) on
# FlashDkvKernel. v6 (train_bench and trainer_parity_test) is branch act-bf16-size; v7
# (trainer_parity_test) is branch parity-gla-two-chunks.
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpackb/fv.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/lib
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $S
for v in v1 v2 v3 v4 v5; do
  timeout 60 /tmp/pk/$v/nn_cuda_test --gtest_filter='*AttentionMatchesCpu*:*RepeatedRuns*:*CrossEntropy*' > $OUT/$v-nn_cuda_test.txt 2>&1
  echo "$v nn_cuda_test rc=$?" >> $S; grep -E "FAILED|PASSED" $OUT/$v-nn_cuda_test.txt >> $S
done
for v in main v1 v2 v3 v4 v5 main; do
  timeout 60 /tmp/pk/$v/nn_cuda_test --gtest_filter='*TimingGpt2*' 2>&1 | grep -E "^(attention|cross-entropy)" | sed "s/^/$v /" >> $S
done
for v in main v1 v2 v3 main; do
  timeout 60 /tmp/pk/$v/train_bench --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step" | sed "s/^/$v /" >> $S
done
# v6 (branch act-bf16-size: ln1, ln2 and act sized by the scheme): trainer_parity_test Gpt on a byte
# shard made here (keel-train from call A's /tmp/k), and its peak memory against main's.
for i in 1 2 3 4 5 6 7 8; do cat README.md; done > /tmp/readme.txt
LD_LIBRARY_PATH=/tmp/k/dist/lib /tmp/k/dist/bin/keel-train prepare-text /tmp/readme.txt /tmp/readme > /dev/null
KEEL_PARITY_SHARD=/tmp/readme_train.bin timeout 150 /tmp/pk/v6/trainer_parity_test --gtest_filter='*Gpt*' \
  > $OUT/v6-parity.txt 2>&1
echo "v6 parity Gpt rc=$?" >> $S; grep -E "^gpt|OK \]|FAILED" $OUT/v6-parity.txt >> $S
# v7 (branch parity-gla-two-chunks): trainer_parity_test Gla at 128 positions (two chunks).
KEEL_PARITY_SHARD=/tmp/readme_train.bin timeout 240 /tmp/pk/v7/trainer_parity_test --gtest_filter='*Gla*' \
  > $OUT/v7-parity.txt 2>&1
echo "v7 parity Gla rc=$?" >> $S; grep -E "^gla|OK \]|FAILED" $OUT/v7-parity.txt >> $S
for v in main v6 main v6; do
  timeout 60 /tmp/pk/$v/train_bench --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step" | sed "s/^/$v memory /" >> $S
done
# The operand statistics' cost at the step (issue 12's target: at most 5%), main's build.
for flag in "" --no-stats; do
  timeout 90 /tmp/pk/main/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3,nvfp4_recipe $flag 2>&1 |
    grep "ms/step" | sed "s/^/main stats ${flag:-on} /" >> $S
done
cat $S
