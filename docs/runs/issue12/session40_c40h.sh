#!/bin/bash
# Session 40, issue 12: the BF16 head's chunked backward (main 62477ae, devpack40h) on a host of 2 GPUs.
# GPU 0: nn_cuda_test whole, then trainer_parity_test Gpt, GptHeadInChunks, Llama.
# GPU 1: train_bench A/B, the build before it (a6a0f62, devpack40b) against it, alternating twice:
#   gpt2-124m bf16 and mxfp8_e4m3 at B16, bf16 at B32 (ms/step and peak MiB).
# Results are written into $OUT as they come (a call cut short keeps them).
set -u
mkdir -p /tmp/h /tmp/b
python3 -c "import lzma,tarfile
tarfile.open(fileobj=lzma.open('devpack40h/h.txz')).extractall('/tmp/h')
tarfile.open(fileobj=lzma.open('devpack40b/b.txz')).extractall('/tmp/b')"
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "new $(cat devpack40h/COMMIT) base $(cat devpack40b/COMMIT)"; } > $OUT/gpu.txt
( export CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH=/tmp/h/dist/lib
  timeout 150 /tmp/h/dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/checks.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|AHeld" $OUT/nn_cuda_test.txt >> $OUT/checks.txt
  timeout 290 /tmp/h/dist/bin/trainer_parity_test --gtest_filter='*Gpt*:*Llama*' > $OUT/parity.txt 2>&1
  echo "parity rc=$?" >> $OUT/checks.txt
  grep -E "OK \]|FAILED" $OUT/parity.txt >> $OUT/checks.txt ) &
( export CUDA_VISIBLE_DEVICES=1
  for round in 1 2; do for side in b h; do
    echo "== $side $(cat devpack40$side/COMMIT) (round $round)" >> $OUT/ab.txt
    LD_LIBRARY_PATH=/tmp/$side/dist/lib timeout 80 /tmp/$side/dist/bin/train_bench --only gpt --steps 10 \
      --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step" >> $OUT/ab.txt
    LD_LIBRARY_PATH=/tmp/$side/dist/lib timeout 80 /tmp/$side/dist/bin/train_bench --only gpt --steps 10 \
      --batch 32 --schemes bf16 2>&1 | grep "ms/step" >> $OUT/ab.txt
  done; done ) &
wait
cat $OUT/checks.txt $OUT/ab.txt
