#!/bin/bash
# Session 26, device run 1 (H100): bf16 activations from their producers (x_bf16); verified and measured against
# the previous commit's train_bench (devpack/old/train_bench, built at f5a0691) in the same run.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/summary.txt
timeout 300 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 300 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
S=bf16,mxfp8_e4m3,nvfp4_recipe
{ echo "== new (x_bf16)"; timeout 200 dist/bin/train_bench --only gpt --steps 20 --schemes $S 2>&1 | grep -E "ms/step|x of"
  echo "== old (f5a0691)"; timeout 200 devpack/old/train_bench --only gpt --steps 20 --schemes $S 2>&1 | grep -E "ms/step|x of"
  echo "== new again, bf16"; timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step|x of"
  echo "== new bf16, analytics 100"; timeout 150 dist/bin/train_bench --only gpt --steps 20 --schemes bf16 --analytics 100 2>&1 | grep -E "ms/step|x of"
  echo "== new gpt bf16 profile"; timeout 100 dist/bin/train_bench --only gpt --steps 10 --schemes bf16 --profile 2>&1 | head -40
} > $OUT/bench.txt 2>&1
grep -v "^  op\|^    >" $OUT/bench.txt | head -40 >> $OUT/summary.txt
