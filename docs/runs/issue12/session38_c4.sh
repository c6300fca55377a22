#!/bin/bash
# Session 38, call 4 (one GPU, nvidia-h200; carry ["devpack38d", ".llmc"]): bench/speed alone on the machine (call 1's
# ran beside 3 GPUs of proxy grids and its llm.c step was 17% slower than session 36's), then the kept attention heads'
# A/B and a bf16 / MXFP8 profile. train_bench from main (devpack38d/COMMIT). ONE tarball back ($OUT/c4.tgz).
set -u
O=$OUT; OUT=/tmp/o4; mkdir -p $OUT /tmp/k
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack38d/d.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; echo "build $(cat devpack38d/COMMIT)"; } > $OUT/gpu.txt
timeout 260 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
echo "speed rc=$?" >> /tmp/speed.log
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
cp /tmp/speed.log $OUT/speed.log
for mode in on off on off; do
  if [ $mode = off ]; then export KEEL_CUDA_OFF=kept_heads; else unset KEEL_CUDA_OFF; fi
  echo "== kept_heads $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step"
done > $OUT/kept_ab.txt 2>&1
unset KEEL_CUDA_OFF
[ $SECONDS -lt 380 ] && timeout 90 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 --profile > $OUT/profile.txt 2>&1
tar -C /tmp -czf $O/c4.tgz o4
cat $OUT/gpu.txt; tail -16 $OUT/speed_summary.txt; cat $OUT/kept_ab.txt; echo "seconds $SECONDS"
