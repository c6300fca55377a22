#!/bin/bash
# Session 28 device call (issue 15): the Hot-Channel Patch folded into the BF16 GEMMs. The HCP and
# linear tests, then nvfp4_recipe against nvfp4_hcp at GPT-2 124M in one process, twice.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/summary.txt
timeout 60 dist/bin/nn_cuda_test --gtest_filter='*Hcp*:*Linear*:*Kept*' > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "k = K|patch  |FAILED|PASSED|Failure" $OUT/nn_cuda_test.txt | head -30 >> $OUT/summary.txt
{ timeout 60 dist/bin/train_bench --only gpt --steps 20 --schemes nvfp4_recipe,nvfp4_hcp 2>&1 | grep -E "ms/step"
  timeout 60 dist/bin/train_bench --only gpt --steps 20 --schemes nvfp4_hcp,nvfp4_recipe 2>&1 | grep -E "ms/step"
} > $OUT/bench.txt 2>&1
cat $OUT/summary.txt $OUT/bench.txt
