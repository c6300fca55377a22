#!/bin/bash
# Session 32, call 1b (kind nvidia-h200, NAMED, one GPU, right after call 1; carry ["devpack32a",
# "data/fortunes_train.bin", ".llmc"]): the head-chunks branch's checks and peak memory, then
# bench/speed against llm.c with session 31's merges (GELU's float4 backward, the update ratio
# from AdamW, the norms' packed copies): issue 12's line and the peak memory.
set -u
if [ ! -e /tmp/k/dist/bin/train_bench ]; then
  mkdir -p /tmp/k
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack32a/a.txz')).extractall('/tmp/k')"
fi
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack32a/v.txz')).extractall('/tmp')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
cat devpack32a/V_COMMIT >> $OUT/gpu.txt
# Branch head-chunks (devpack32a/v.txz, commit in V_COMMIT): the BF16 head in chunks of rows.
# Merge it when nn_cuda_test passes (CrossEntropyBf16AndTheHeadBackwardMatchTheFp32Path has the
# chunk cases), parity Gpt and Llama pass, and the bf16 peak falls by about 1.3 GiB.
{ timeout 150 /tmp/v/nn_cuda_test > /tmp/nnv.txt 2>&1; echo "variant nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" /tmp/nnv.txt
  timeout 120 /tmp/v/trainer_parity_test --gtest_filter='*Gpt*:*Llama*' > /tmp/parv.txt 2>&1; echo "variant parity rc=$?"
  grep -E "^(gpt|llama) |OK \]|FAILED" /tmp/parv.txt
  # main, the branch (256 MiB chunks: 16 at B16), the branch with 1 GiB chunks (4): speed and peak
  timeout 60 /tmp/k/dist/bin/train_bench --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step" | sed "s#^#main #"
  timeout 60 /tmp/v/train_bench --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step" | sed "s#^#chunks-256 #"
  timeout 60 /tmp/v/train_bench --only gpt --steps 10 --schemes bf16 --head-chunk-mib 1024 2>&1 | grep "ms/step" | sed "s#^#chunks-1024 #"
} > $OUT/variant.txt 2>&1
timeout 300 python3 bench/speed --bin /tmp/k/dist/bin --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; tail -30 /tmp/speed.log > $OUT/speed_log_tail.txt
cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
cat $OUT/variant.txt; tail -22 $OUT/speed_summary.txt
