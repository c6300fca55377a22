#!/bin/bash
# Session 29 device call 4: the GLA kernels with per-thread register blocking, two blocks per
# multiprocessor in the backward's state kernels and a parallel finish (then a reverse scan):
# nn_cuda_test Gla*, trainer_parity_test Gla, gla 124M bf16 step time against aa08daf's build
# (/tmp/pk/gla) in the same call, and ncu durations of the new kernels.
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/main/lib
M=/tmp/pk/main/bin G=/tmp/pk/gla N=/tmp/pk/new
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $S
timeout 200 $N/nn_cuda_test --gtest_filter='*Gla*' > $OUT/new_nn_cuda_test.txt 2>&1; echo "new nn_cuda_test Gla rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]" $OUT/new_nn_cuda_test.txt >> $S
timeout 60 $M/train_bench --only gpt --steps 1 --schemes bf16 > /dev/null 2>&1
gla() {  # name binary extra...
  local name=$1 bin=$2; shift 2
  timeout 150 $bin --config examples/gla_124m.yaml --steps 25 --quiet --run-dir /tmp/r-$name \
    --set data.train=/tmp/keel-train-bench-tokens.bin --set data.val=/tmp/keel-train-bench-tokens.bin \
    --set checkpoint_every=0 --set data.eval_every=0 "$@" > /tmp/r-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "
import json,statistics
L=[json.loads(l) for l in open('/tmp/r-$name/metrics.jsonl')]
t=[x['tokens_per_s'] for x in L if 'tokens_per_s' in x][8:]
print('lines %d tok/s median %.0f loss last %r' % (len(L), statistics.median(t), L[-1].get('loss')))
" 2>&1 | tail -1)" | tee -a $S
}
gla gla-before $G/keel-train
gla gla-new $N/keel-train
gla gla-before-2 $G/keel-train
gla gla-new-2 $N/keel-train
gla gla-new-prof $N/keel-train --profile; tail -40 /tmp/r-gla-new-prof.log > $OUT/gla_new_profile.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 200 $N/trainer_parity_test --gtest_filter='*Gla*' > $OUT/new_parity.txt 2>&1; echo "new parity Gla rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]|^gla" $OUT/new_parity.txt >> $S
timeout 150 ncu --clock-control none -k 'regex:Gla(Intra|Forward|Dq|DkDv|Finish|GateScan)Kernel' --launch-skip 22 -c 9 \
  --section SpeedOfLight --section Occupancy \
  $N/keel-train --config examples/gla_124m.yaml --steps 1 --quiet --run-dir /tmp/r-ncu \
  --set data.train=/tmp/keel-train-bench-tokens.bin --set data.val=/tmp/keel-train-bench-tokens.bin \
  --set checkpoint_every=0 --set data.eval_every=0 > $OUT/ncu_gla_new.txt 2>&1; echo "ncu rc=$?" >> $S
grep -E "^  .*Kernel|Duration|Achieved Occupancy" $OUT/ncu_gla_new.txt | sed 's/(unnamed.*//' >> $S
cat $S
