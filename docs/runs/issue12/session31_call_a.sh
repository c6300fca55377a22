#!/bin/bash
# Session 31 plan, call A (kind nvidia-h200-x4; carry ["devpack31a", "data/fortunes_train.bin", ".llmc"]):
# devpack31a/a.txz = dist/ of main at the end of session 30 (keel-train, keeld, keel-worker, keel,
# train_bench, nn_cuda_test, trainer_parity_test, quant_bench, cuda_quant_test + libs) and the BPE files;
# v.txz = nn_cuda_test, train_bench and trainer_parity_test of branch session31-variant (main +
# analytics-fewer-ops + adamw-update-ratio + gelu-bwd-float4); val.txt.xz. Unpacks into /tmp
# for calls B and C (which must follow at once), and uses the 4 GPUs:
#   GPU 0: trainer_parity_test, all cases (Gla at 128 positions never ran to the end on main), then
#          the variant's Gpt and Proxy cases
#   GPU 1: outlier analytics' cost with the per-op profile, main against the variant (issue 15:
#          proxy mxfp8 at 4.79% > 3%), then train_bench bf16/mxfp8 main against the variant
#          alternating (the AdamW update ratio, GELU's float4 backward: speed and peak memory), and
#          the bf16 per-op profile of each
#   GPU 2: nn_cuda_test of main and of the branch, then quant_bench (issue 12's quantizer targets)
#   GPU 3: bench/speed against llm.c (issue 12's headline line)
set -u
mkdir -p /tmp/k /tmp/corpus /tmp/v
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack31a/a.txz')).extractall('/tmp/k')"
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack31a/v.txz')).extractall('/tmp')"
cp devpack31a/val.txt.xz /tmp/corpus/
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpus.txt
(CUDA_VISIBLE_DEVICES=0 timeout 520 $B/trainer_parity_test > /tmp/parity.txt 2>&1; echo "rc=$?" >> /tmp/parity.txt
 CUDA_VISIBLE_DEVICES=0 timeout 150 /tmp/v/trainer_parity_test --gtest_filter='*Gpt*:*Proxy*' > /tmp/parity_v.txt 2>&1
 echo "variant rc=$?" >> /tmp/parity_v.txt
 cat /tmp/parity.txt /tmp/parity_v.txt | grep -E "^(proxy|gpt|llama|gla) |OK \]|FAILED|rc=" > $OUT/parity.txt) &
(for bin in $B/train_bench /tmp/v/train_bench; do
   echo "=== $bin"
   CUDA_VISIBLE_DEVICES=1 timeout 120 $bin --only proxy --steps 20 --analytics 100 --profile 2>&1 | tail -120
 done > $OUT/analytics_profile.txt 2>&1
 for bin in $B/train_bench /tmp/v/train_bench; do
   CUDA_VISIBLE_DEVICES=1 timeout 150 $bin --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --analytics 100 2>&1 | sed "s#^#$(basename $(dirname $bin)) #"
 done > $OUT/analytics_gpt.txt 2>&1
 for bin in $B/train_bench /tmp/v/train_bench $B/train_bench /tmp/v/train_bench; do
   CUDA_VISIBLE_DEVICES=1 timeout 90 $bin --only gpt --steps 20 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step" | sed "s#^#$(basename $(dirname $bin)) #"
 done >> $OUT/analytics_gpt.txt 2>&1
 # Where the variant's bf16 step differs (AdamW, GELU's backward): the per-op profile of each.
 for bin in $B/train_bench /tmp/v/train_bench; do
   echo "=== profile $bin"
   CUDA_VISIBLE_DEVICES=1 timeout 90 $bin --only gpt --steps 10 --schemes bf16 --profile 2>&1 | tail -45
 done >> $OUT/analytics_gpt.txt 2>&1) &
(for bin in $B/nn_cuda_test /tmp/v/nn_cuda_test; do
   CUDA_VISIBLE_DEVICES=2 timeout 200 $bin > /tmp/nn.txt 2>&1; echo "$bin rc=$?"
   grep -E "^\[  (PASSED|FAILED)|FAILED  \]|^(attention|cross-entropy)" /tmp/nn.txt
 done > $OUT/nn_cuda_test.txt 2>&1
 CUDA_VISIBLE_DEVICES=2 timeout 200 $B/quant_bench > $OUT/quant_bench.txt 2>&1) &
(CUDA_VISIBLE_DEVICES=3 timeout 540 python3 bench/speed --bin /tmp/k/dist/bin --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
 cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; tail -40 /tmp/speed.log > $OUT/speed_log_tail.txt) &
wait
cat $OUT/parity.txt $OUT/nn_cuda_test.txt 2>/dev/null | tail -40; tail -25 $OUT/speed_summary.txt 2>/dev/null
