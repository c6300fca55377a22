#!/bin/bash
# Session 26, device run 2 (H100): GELU's backward writes fc's dy in bf16 (GeluBackwardBf16); verified, and
# measured against run 1's build (3a02fd0, devpack/old/train_bench) in the same call.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/summary.txt
timeout 300 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 300 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
{ echo "== new (GeluBackwardBf16)"; timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step"
  echo "== old (3a02fd0)"; timeout 100 devpack/old/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step"
  echo "== new again"; timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step"
  echo "== new gpt bf16 profile"; timeout 100 dist/bin/train_bench --only gpt --steps 10 --schemes bf16 --profile 2>&1 | head -40
} > $OUT/bench.txt 2>&1
grep -v "^  op\|^    >" $OUT/bench.txt | head -40 >> $OUT/summary.txt
