#!/bin/bash
# Session 25, device run 6 (H100): the head's dy in bf16 from the cross-entropy, DownloadMany; verified and measured.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/summary.txt
timeout 300 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 300 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
B=dist/bin/train_bench
{ echo "== gpt, analytics 100"; timeout 300 $B --only gpt --steps 20 --schemes bf16,mxfp8_e4m3,nvfp4_recipe --analytics 100 2>&1 | grep -E "ms/step|x of"
  echo "== proxy analytics 100"; timeout 100 $B --only proxy --steps 200 --analytics 100 2>&1 | grep -E "ms/step"
  echo "== gpt bf16 profile"; timeout 100 $B --only gpt --steps 10 --schemes bf16 --profile 2>&1 | head -40
} > $OUT/bench.txt 2>&1
grep -v "^  op\|^    >" $OUT/bench.txt | head -30 >> $OUT/summary.txt
