#!/bin/bash
# Session 25, device run 1: the GPU code that landed unrun (analytics, GLA), analytics cost, and a kernel-level bf16 profile.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/summary.txt
timeout 300 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" | tee -a $OUT/summary.txt
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -12 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 300 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" | tee -a $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
B=dist/bin/train_bench
{ for a in 0 100; do echo "== analytics $a"; timeout 200 $B --only gpt --steps 20 --schemes bf16,nvfp4_recipe --analytics $a 2>&1 | grep -E "ms/step|x of"; done
  echo "== analytics 1 (every step, upper bound)"; timeout 200 $B --only gpt --steps 10 --schemes bf16 --analytics 1 2>&1 | grep -E "ms/step"
  echo "== analytics 1 + maps"; timeout 200 $B --only gpt --steps 10 --schemes bf16 --analytics 1 --analytics-maps 2>&1 | grep -E "ms/step"
  echo "== proxy analytics 0 / 100"; for a in 0 100; do timeout 100 $B --only proxy --steps 200 --analytics $a 2>&1 | grep -E "ms/step"; done
} > $OUT/analytics.txt 2>&1
cat $OUT/analytics.txt >> $OUT/summary.txt
timeout 240 ncu --metrics gpu__time_duration.sum --csv --cache-control none --clock-control none $B --only gpt --steps 1 --schemes bf16 > /tmp/ncu.csv 2>/tmp/ncu.err
echo "ncu rc=$?" >> $OUT/summary.txt
python3 devpack/ncu_sum.py /tmp/ncu.csv 3 > $OUT/kernels_bf16.txt 2>&1; tail -3 /tmp/ncu.err >> $OUT/kernels_bf16.txt
