#!/bin/bash
# Session 30, call E (one H200; carry ["devpacke", "data/fortunes_train.bin"]): main after the
# issue-12 merges (flash forward one tile, half-row CE, act-bf16-size, parity gla 128):
# trainer_parity_test (Gpt first: act-bf16-size's parity), nn_cuda_test, train_bench against the
# pre-merge main's train_bench (81a8dc4-equivalent, devpackb's "main") in the same call.
set -u
mkdir -p /tmp/e && python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpacke/e.txz')).extractall('/tmp/e')"
export LD_LIBRARY_PATH=/tmp/e/dist/lib
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $S
timeout 120 /tmp/e/dist/bin/trainer_parity_test --gtest_filter='*Gpt*' > $OUT/parity_gpt.txt 2>&1
echo "trainer_parity_test Gpt rc=$?" >> $S; grep -E "^gpt|OK \]|FAILED" $OUT/parity_gpt.txt >> $S
timeout 90 /tmp/e/dist/bin/nn_cuda_test > /tmp/nn.txt 2>&1
echo "nn_cuda_test rc=$?" >> $S; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^(attention|cross-entropy)" /tmp/nn.txt >> $S
for b in old new old new; do
  bin=/tmp/e/dist/bin/train_bench; [ $b = old ] && bin=/tmp/e/old/train_bench
  timeout 60 $bin --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step" | sed "s/^/$b /" >> $S
done
timeout 90 /tmp/e/dist/bin/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3,mxfp4,nvfp4,nvfp4_recipe 2>&1 | grep "ms/step" | sed "s/^/new /" >> $S
timeout 150 /tmp/e/dist/bin/trainer_parity_test --gtest_filter='-*Gpt*' > $OUT/parity_rest.txt 2>&1
echo "trainer_parity_test rest rc=$?" >> $S; grep -E "OK \]|FAILED" $OUT/parity_rest.txt >> $S
cat $S
