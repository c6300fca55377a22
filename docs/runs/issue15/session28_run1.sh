#!/bin/bash
# Session 28 device call 1 (issue 15): nn_cuda_test (all), trainer_parity_test (nvfp4_hcp, chon added),
# and the Hot-Channel Patch's overhead at GPT-2 124M against nvfp4_recipe in the same run.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 240 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 240 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
{ echo "== gpt 124M B16 x T1024: nvfp4_recipe vs nvfp4_hcp (then again in the other order)"
  timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes nvfp4_recipe,nvfp4_hcp 2>&1 | grep -E "ms/step|x of|scheme|device|GPU"
  timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes nvfp4_hcp,nvfp4_recipe 2>&1 | grep -E "ms/step|x of"
  echo "== nvfp4_hcp profile"; timeout 60 dist/bin/train_bench --only gpt --steps 10 --schemes nvfp4_hcp --profile 2>&1 | head -50
} > $OUT/bench.txt 2>&1
cat $OUT/summary.txt; grep -v "^  op\|^    >" $OUT/bench.txt | head -60
