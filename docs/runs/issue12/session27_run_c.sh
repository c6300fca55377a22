#!/bin/bash
# Session 27, device call C: nn_cuda_test and trainer_parity_test at the build with the drift rule
# and the Hot-Channel Patch's CUDA refusal (commit 721ddf1).
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/summary.txt
timeout 240 dist/bin/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|cuda says|Hot-Channel" $OUT/nn_cuda_test.txt | tail -8 >> $OUT/summary.txt
KEEL_PARITY_SHARD=data/fortunes_train.bin timeout 200 dist/bin/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?" >> $OUT/summary.txt
grep -E "FAILED|PASSED|OK \]" $OUT/parity.txt >> $OUT/summary.txt
cat $OUT/summary.txt
