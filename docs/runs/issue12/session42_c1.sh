#!/bin/bash
# Planned in session 41 for session 42 (not yet run): where the non-GEMM time of GPT-2 124M's bf16 and MXFP8
# steps is limited, by Nsight Compute's speed-of-light section (memory or compute, and how close), one kernel
# family at a time. ncu reads hardware counters on the Firecracker machines (docs of the device tool, KINDS.md);
# --clock-control none leaves the clocks alone. Prepare: scripts/dist --pack pack/dist.txz --only
# //bench:train_bench; cp this file to the repository root; carry ["pack"].
# Each family: the first 2 matching launches after the warm-up (-s skips launches of that family only).
set -u
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit)";
  uname -r; ncu --version | tail -1; } > $OUT/gpu.txt
cat $OUT/gpu.txt
for spec in "bf16 CrossEntropyFusedKernel" "bf16 FlashForwardKernel" "bf16 FlashDqKernel" "bf16 FlashDkvKernel" \
            "bf16 GeluBf16Kernel" "bf16 LayerNormBackwardKernel" "bf16 AdamWTensorsKernel" \
            "mxfp8_e4m3 MxBothAxesColumnPartialsKernel" "mxfp8_e4m3 MxRowsColumnPartialsKernel" "mxfp8_e4m3 MxRowsKernel"; do
  set -- $spec
  timeout 120 ncu --clock-control none --section SpeedOfLight --section Occupancy -k "regex:$2" -s 8 -c 2 \
    $B/train_bench --only gpt --steps 1 --schemes $1 > $OUT/ncu_$1_$2.txt 2>&1
  echo "== $1 $2 rc=$?"; grep -E "^\s+(Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy)|^\s+[A-Za-z].*\(.*\)x\(" $OUT/ncu_$1_$2.txt | head -14
done
echo "seconds $SECONDS"
