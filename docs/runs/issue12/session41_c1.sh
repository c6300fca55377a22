#!/bin/bash
# Planned in session 40 for session 41's first call (not yet run): one GPU is enough.
# Prepare here: scripts/dist --pack pack/dist.txz; scripts/fetch-llmc .llmc; scripts/prepare-fortunes;
#   move docs/runs/issue14/*-series.csv.xz aside (docs/gpu.md); cp this file to the repository root;
#   run with carry ["pack", ".llmc", "data"].
# 1. nn_cuda_test whole (first runs: MxKeptXGivesTheBitsAndStatsOfQuantizingAgain, FlashOnePassForward...).
# 2. train_bench A/B of mx_keep_x (off, on, off, on): gpt2-124m mxfp8_e4m3 and mxfp4 at B16, ms/step and peak;
#    and of flash_one_pass (bf16, mxfp8_e4m3).
# 3. The MX head's chunk: train_bench --head-chunk-mib 1024 (the default), 512, 256 (mxfp8_e4m3).
# 4. bench/speed against llm.c (the headline line; session 40's head change lowered bf16's peak).
# Each result goes into $OUT as it comes (a call cut short keeps what finished). Two calls (1-3 take about 5
# minutes, 4 about 5 more): `bash session41_c1.sh` for 1-3, `SPEED=1 bash session41_c1.sh` for 4.
set -u
mkdir -p /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)"; } > $OUT/gpu.txt
if [ "${SPEED:-0}" != 1 ]; then
timeout 150 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/checks.txt
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|MxKeptX|FlashOnePass" $OUT/nn_cuda_test.txt >> $OUT/checks.txt
for mode in off on off on; do
  echo "== mx_keep_x $mode" >> $OUT/ab.txt
  if [ $mode = on ]; then export KEEL_CUDA_ON=mx_keep_x; else unset KEEL_CUDA_ON; fi
  timeout 80 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3,mxfp4 2>&1 | grep "ms/step" >> $OUT/ab.txt
done
for mode in off on off on; do
  echo "== flash_one_pass $mode" >> $OUT/ab.txt
  if [ $mode = on ]; then export KEEL_CUDA_ON=flash_one_pass; else unset KEEL_CUDA_ON; fi
  timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step" >> $OUT/ab.txt
done
unset KEEL_CUDA_ON
for mib in 1024 512 256; do
  echo "== --head-chunk-mib $mib" >> $OUT/ab.txt
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --head-chunk-mib $mib 2>&1 | grep "ms/step" >> $OUT/ab.txt
done
cat $OUT/checks.txt $OUT/ab.txt
else
timeout 540 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > $OUT/speed.log 2>&1
echo "speed rc=$?" >> $OUT/speed.log
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
tail -16 $OUT/speed_summary.txt 2>/dev/null
fi
echo "seconds $SECONDS"
