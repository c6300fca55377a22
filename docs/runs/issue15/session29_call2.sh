#!/bin/bash
# Session 29 device call 2: trainer_parity_test on main (all) and on the gla-chunk-parallel build (Gla),
# with the fortunes shard carried (call 1 lacked it).
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/main/lib
M=/tmp/pk/main/bin G=/tmp/pk/gla
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $S
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 200 $G/trainer_parity_test --gtest_filter='*Gla*' > $OUT/gla_parity.txt 2>&1; echo "branch parity Gla rc=$?" >> $S
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 300 $M/trainer_parity_test > $OUT/parity.txt 2>&1; echo "main parity rc=$?" >> $S
grep -E "FAILED|PASSED|OK \]|^gla|^gpt|^llama" $OUT/gla_parity.txt $OUT/parity.txt >> $S
cat $S
