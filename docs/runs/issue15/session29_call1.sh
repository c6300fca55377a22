#!/bin/bash
# Session 29 device call 1: main's nn_cuda_test (all) and trainer_parity_test (all; first run after the
# HCP fold and the review commits), the gla-chunk-parallel build's GLA tests, gla 124M bf16 step time
# of both builds in one call (random GPT-2 token ids), and ncu's view of the fused attention kernels.
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/main/lib
M=/tmp/pk/main/bin G=/tmp/pk/gla
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $S
timeout 200 $G/nn_cuda_test --gtest_filter='*Gla*' > $OUT/gla_nn_cuda_test.txt 2>&1; echo "branch nn_cuda_test Gla rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]" $OUT/gla_nn_cuda_test.txt >> $S
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 200 $G/trainer_parity_test --gtest_filter='*Gla*' > $OUT/gla_parity.txt 2>&1; echo "branch parity Gla rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]" $OUT/gla_parity.txt >> $S
timeout 60 $M/train_bench --only gpt --steps 3 --schemes bf16 > $OUT/tokens.txt 2>&1
gla() {  # name binary extra...
  local name=$1 bin=$2; shift 2
  timeout 150 $bin --config examples/gla_124m.yaml --steps 25 --quiet --run-dir /tmp/r-$name \
    --set data.train=/tmp/keel-train-bench-tokens.bin --set data.val=/tmp/keel-train-bench-tokens.bin \
    --set checkpoint_every=0 --set data.eval_every=0 "$@" > /tmp/r-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "
import json,statistics
L=[json.loads(l) for l in open('/tmp/r-$name/metrics.jsonl')]
t=[x['tokens_per_s'] for x in L if 'tokens_per_s' in x][8:]
print('lines %d tok/s median %.0f loss last %s' % (len(L), statistics.median(t), L[-1].get('loss')))
" 2>&1 | tail -1)" | tee -a $S
}
gla gla-main $M/keel-train
gla gla-branch $G/keel-train
gla gla-main-2 $M/keel-train
gla gla-branch-2 $G/keel-train
gla gla-branch-prof $G/keel-train --profile; tail -40 /tmp/r-gla-branch-prof.log > $OUT/gla_branch_profile.txt
tail -5 /tmp/r-gla-main.log >> $S
timeout 240 $M/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "main nn_cuda_test rc=$?" >> $S
grep -E "FAILED|PASSED|tests ran" $OUT/nn_cuda_test.txt | tail -8 >> $S
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 240 $M/trainer_parity_test > $OUT/parity.txt 2>&1; echo "main parity rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $S
timeout 100 ncu --clock-control none -k regex:Flash -c 3 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section ComputeWorkloadAnalysis --section WarpStateStats \
  $M/nn_cuda_test --gtest_filter='*TimingGpt2*' > $OUT/ncu_flash.txt 2>&1; echo "ncu rc=$?" >> $S
cat $S
