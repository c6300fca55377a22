#!/bin/bash
# Session 36, call 1 (kind nvidia-h200-x4, NAMED; carry ["devpack36a", "devpack36s", ".llmc", "data/fortunes_train.bin"]).
# Branch mx-head-chunks (main + mx-tiles-prefetch: the MX tile kernel's loads a group ahead, + an MX
# head in chunks with its backward per chunk). GPUs 1-3: the proxy grid at
# lr 1e-3, depth 8, seed 1, with the rollback-200 variant (30 runs, 10 a GPU): the last cell of seed 1.
# GPU 0: nn_cuda_test, parity, the A/B of mx_tiles_prefetch (same binary; KEEL_CUDA_OFF=mx_tiles_prefetch
# turns it off), a profile, bench/speed against llm.c. Everything lands in /tmp/o1 and goes back as ONE
# tarball ($OUT/c1.tgz): the device returns at most 8 files a call.
set -u
O=$OUT; OUT=/tmp/o1; mkdir -p $OUT /tmp/k
python3 -c "import lzma,tarfile
for p in ('devpack36a/a.txz', 'devpack36s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack36a/COMMIT)"; } > $OUT/gpu.txt
name=grid-h8-lr1e-3-seed1-rb200
python3 scripts/policy-grid gen --name $name --layers 8 --widths 256,384,512 --lrs 1e-3 --seeds 1 \
  --rollback 200 --gpus 0.1 -o /tmp/$name.yaml && cp /tmp/$name.yaml $OUT/
( python3 scripts/policy-grid run --bin $B --sweep /tmp/$name.yaml --dir /tmp/gs-$name --out $OUT \
    --port 7397 --deadline-s 530 --worker-args '--gpus 1,2,3' > $OUT/$name-run.log 2>&1
  echo "rc=$?" >> $OUT/$name-run.log
  python3 scripts/policy-grid report $OUT/$name-runs.jsonl --series $OUT/$name-series.csv.gz -o $OUT/$name-report.md \
    > /dev/null 2>&1 ) &
GRID=$!
export CUDA_VISIBLE_DEVICES=0
{ timeout 200 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/nn_cuda_test.txt
  grep -E "^\[ +(OK|FAILED) +\] NnCudaTest\.(MxDownColumnsInTiles|LinearDyInOnePass|LayerNormBackwardInOnePass|KeelCudaOff|LinearMatchesCpu|QuantizeDequantize)" $OUT/nn_cuda_test.txt
  timeout 200 $B/trainer_parity_test --gtest_filter='*Gpt*:*Proxy*' > $OUT/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|proxy) |OK \]|FAILED" $OUT/parity.txt
} > $OUT/checks.txt 2>&1
for mode in on off on off; do
  if [ $mode = off ]; then export KEEL_CUDA_OFF=mx_tiles_prefetch; else unset KEEL_CUDA_OFF; fi
  echo "== mx_tiles_prefetch $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 2>&1 | grep "ms/step"
  timeout 30 $B/train_bench --only proxy --steps 20 --schemes mxfp8_e4m3 2>&1 | grep "ms/step"
done > $OUT/ab.txt 2>&1
unset KEEL_CUDA_OFF
# The MX head: one piece (4096 MiB: a chunk of every row) against chunks of 1024 MiB (the default:
# 4 of 4096 rows) and 512 MiB (8 of 2048: each chunk's dy small enough for dy_one_pass).
for mib in 4096 1024 512 4096 1024 512; do
  echo "== --head-chunk-mib $mib"
  timeout 40 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --head-chunk-mib $mib 2>&1 | grep "ms/step"
done > $OUT/head_ab.txt 2>&1
timeout 90 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --profile > $OUT/profile_mxfp8.txt 2>&1
timeout 170 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
# The tile kernel's own time and DRAM throughput, with and without the prefetch, from ncu's counters
# (Firecracker machines read them; gVisor ones do not: then the files say so). Only with time left.
for mode in on off; do
  [ $SECONDS -lt 430 ] || { echo "skipped: ${SECONDS} s gone" > $OUT/ncu_$mode.txt; continue; }
  if [ $mode = off ]; then export KEEL_CUDA_OFF=mx_tiles_prefetch; else unset KEEL_CUDA_OFF; fi
  timeout 60 ncu --clock-control none --kernel-name regex:MxBothAxes --launch-skip 30 --launch-count 6 \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
    $B/train_bench --only gpt --steps 1 --schemes mxfp8_e4m3 > $OUT/ncu_$mode.txt 2>&1
  echo "rc=$?" >> $OUT/ncu_$mode.txt
done
unset KEEL_CUDA_OFF
wait $GRID
tar -C /tmp -czf $O/c1.tgz o1
cat $OUT/checks.txt $OUT/ab.txt $OUT/head_ab.txt; tail -4 $OUT/speed_summary.txt; tail -4 $OUT/$name-run.log
sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -16
sed -n '/## Rollback distance/,/^| format/p' $OUT/$name-report.md
grep -hE "MxBothAxes|gpu__time|dram__|rc=" $OUT/ncu_on.txt $OUT/ncu_off.txt | head -40
