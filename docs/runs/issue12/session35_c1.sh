#!/bin/bash
# Session 35, call 1 (kind nvidia-h200-x4, NAMED; carry ["devpack35a", "devpack35s", ".llmc", "data/fortunes_train.bin"]).
# Branch mx-dy-both-axes (the MX tile kernels). GPUs 1-3: the proxy grid at depth 8, lr 6e-4, seed 1
# (21 runs, 7 a GPU) in the background. GPU 0: nn_cuda_test (four new tests, never run on a GPU),
# parity, the A/B of the branch's fusions (same binary; KEEL_CUDA_OFF=dy_one_pass,mx_cols_tiles,
# ln_backward_fused turns them off), a profile, then bench/speed against llm.c. Results land in $OUT
# as they finish.
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile
for p in ('devpack35a/a.txz', 'devpack35s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack35a/COMMIT)"; } > $OUT/gpu.txt
name=grid-h8-lr6e-4-seed1
python3 scripts/policy-grid gen --name $name --layers 8 --widths 256,384,512 --lrs 6e-4 --seeds 1 \
  --gpus 0.14 -o /tmp/$name.yaml && cp /tmp/$name.yaml $OUT/
( python3 scripts/policy-grid run --bin $B --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
    --port 7397 --deadline-s 520 --worker-args '--gpus 1,2,3' > $OUT/$name-run.log 2>&1
  echo "rc=$?" >> $OUT/$name-run.log
  python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md \
    > /dev/null 2>&1 ) &
GRID=$!
export CUDA_VISIBLE_DEVICES=0
{ timeout 200 $B/nn_cuda_test > /tmp/nn.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" /tmp/nn.txt
  grep -E "^\[ +(OK|FAILED) +\] NnCudaTest\.(MxDownColumnsInTiles|LinearDyInOnePass|LayerNormBackwardInOnePass|KeelCudaOff|LinearMatchesCpu|QuantizeDequantize|LayerNormMatchesCpu)" /tmp/nn.txt
  timeout 120 $B/trainer_parity_test --gtest_filter='*Gpt*:*Proxy*' > /tmp/par.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|proxy) |OK \]|FAILED" /tmp/par.txt
} > $OUT/checks.txt 2>&1
cp /tmp/nn.txt $OUT/nn_cuda_test.txt
for mode in on off on off; do
  if [ $mode = off ]; then export KEEL_CUDA_OFF=dy_one_pass,mx_cols_tiles,ln_backward_fused; else unset KEEL_CUDA_OFF; fi
  echo "== the branch's fusions $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
  timeout 100 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3,mxfp4 2>&1 | grep "ms/step"
  timeout 30 $B/train_bench --only proxy --steps 20 --schemes mxfp8_e4m3 2>&1 | grep "ms/step"
done > $OUT/ab.txt 2>&1
unset KEEL_CUDA_OFF
timeout 90 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --profile > $OUT/profile_mxfp8.txt 2>&1
timeout 170 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; tail -30 /tmp/speed.log > $OUT/speed_log_tail.txt
cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
wait $GRID
cat $OUT/checks.txt $OUT/ab.txt; tail -4 $OUT/speed_summary.txt; tail -4 $OUT/$name-run.log
sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -16
