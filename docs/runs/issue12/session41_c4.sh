#!/bin/bash
# Session 41, call 4 (one GPU): which of cuDNN's two numerics moves trainer_parity_test: P rounded before it is
# normalized (flash_one_pass has it too, with O in fp32) or O in bf16. Pack of session41_c3.sh; carry ["pack", "data"].
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)"; } > $OUT/gpu.txt
KEEL_CUDA_ON=flash_one_pass timeout 100 $B/trainer_parity_test --gtest_filter='*Gpt' > $OUT/parity_one_pass.txt 2>&1
echo "parity flash_one_pass rc=$?" >> $OUT/parity_one_pass.txt
timeout 100 $B/trainer_parity_test --gtest_filter='*Gpt' > $OUT/parity_default.txt 2>&1
echo "parity default rc=$?" >> $OUT/parity_default.txt
grep -E "^gpt|OK \]|FAILED \]|rc=" $OUT/parity_one_pass.txt $OUT/parity_default.txt
echo "seconds $SECONDS"
