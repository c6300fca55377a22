#!/bin/bash
# Session 29 device call 3: where the time goes inside the GLA recurrence (gla 124M, B16 x T1024, bf16;
# ncu durations of one forward's and one backward's kernels) and inside the fused attention's backward.
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/main/lib
M=/tmp/pk/main/bin G=/tmp/pk/gla
timeout 60 $M/train_bench --only gpt --steps 1 --schemes bf16 > /dev/null 2>&1
timeout 200 ncu --clock-control none -k 'regex:Gla(Intra|Forward|Dq|DkDv|Finish)Kernel' --launch-skip 0 -c 30 \
  --section SpeedOfLight --section LaunchStats --section Occupancy \
  $G/keel-train --config examples/gla_124m.yaml --steps 1 --quiet --run-dir /tmp/r-ncu \
  --set data.train=/tmp/keel-train-bench-tokens.bin --set data.val=/tmp/keel-train-bench-tokens.bin \
  --set checkpoint_every=0 --set data.eval_every=0 > $OUT/ncu_gla.txt 2>&1; echo "ncu gla rc=$?"
timeout 120 ncu --clock-control none -k 'regex:Flash(Dq|Dkv)Kernel' -c 2 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats $M/nn_cuda_test --gtest_filter='*TimingGpt2*' > $OUT/ncu_flash_bwd.txt 2>&1
echo "ncu flash rc=$?"
grep -E "Kernel|Duration|Registers Per|Achieved Occupancy|Grid Size|Compute \(SM\) Throughput" $OUT/ncu_gla.txt $OUT/ncu_flash_bwd.txt | grep -v "==PROF" | head -150
