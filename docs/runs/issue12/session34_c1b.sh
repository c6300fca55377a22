#!/bin/bash
# Session 34, call 1b (kind nvidia-h200, NAMED, right after call 1; carry ["devpack34a", ".llmc"]):
# bench/speed against llm.c (issue 12's line and the peak memory, analytics-bf16 merged).
set -u
if [ ! -e /tmp/k/dist/bin/train_bench ]; then
  mkdir -p /tmp/k
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack34a/a.txz')).extractall('/tmp/k')"
fi
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
timeout 500 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > /tmp/speed.log 2>&1
cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; tail -30 /tmp/speed.log > $OUT/speed_log_tail.txt
cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
tail -24 $OUT/speed_summary.txt
