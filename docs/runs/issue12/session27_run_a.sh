#!/bin/bash
# Session 27, device call A (issue 12): the fused residual add + LayerNorm. Checks, then train_bench
# against the session's first build (devpack/old/train_bench, commit 7b7b60a) in the same run.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $OUT/summary.txt
timeout 240 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 200 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
S=bf16,mxfp8_e4m3,nvfp4_recipe
{ echo "== new (AddLayerNormForward)"; timeout 100 dist/bin/train_bench --only gpt --steps 20 --schemes $S 2>&1 | grep -E "ms/step|x of"
  echo "== old (7b7b60a)"; timeout 100 devpack/old/train_bench --only gpt --steps 20 --schemes $S 2>&1 | grep -E "ms/step|x of"
  echo "== new again, bf16"; timeout 60 dist/bin/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step|x of"
  echo "== old again, bf16"; timeout 60 devpack/old/train_bench --only gpt --steps 20 --schemes bf16 2>&1 | grep -E "ms/step|x of"
  echo "== new gpt bf16 profile"; timeout 60 dist/bin/train_bench --only gpt --steps 10 --schemes bf16 --profile 2>&1 | head -45
} > $OUT/bench.txt 2>&1
grep -v "^  op\|^    >" $OUT/bench.txt | head -40 >> $OUT/summary.txt
cat $OUT/summary.txt
