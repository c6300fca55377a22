#!/bin/bash
# Session 33, call 1b (kind nvidia-h200, NAMED, right after call 1; carry ["devpack33a"]). The
# probe's cost and the per-op profiles (main's train_bench; unpacked by call 1 when warm).
set -u
if [ ! -e /tmp/k/dist/bin/train_bench ]; then
  mkdir -p /tmp/k
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack33a/a.txz')).extractall('/tmp/k')"
fi
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
# 4. The gradient-bias probe's cost at GPT-2 124M (a language model's policy: default probes every
#    100 steps: issue 14's overhead), then where the quantized schemes' extra time goes (issue 12).
{ timeout 100 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --probe 100 2>&1 | grep -E "ms/step|every"
  timeout 100 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --probe 100 --probe-reference bf16 2>&1 | grep -E "ms/step|every"
} > $OUT/probe_cost.txt 2>&1
timeout 170 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3,mxfp8_e4m3+bf16_head,mxfp4,mxfp4+bf16_head,nvfp4 \
  --profile > $OUT/gpt_profiles.txt 2>&1
cat $OUT/probe_cost.txt; grep -E "profile of|all ops|quantize|gemm  |x of bf16" $OUT/gpt_profiles.txt
[ -e /tmp/v/nn_cuda_test ] || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack33a/v.txz')).extractall('/tmp')"
timeout 60 /tmp/v/nn_cuda_test --gtest_filter='*Bf16InPlace*' > $OUT/bf16fail.txt 2>&1; tail -c 6000 $OUT/bf16fail.txt
