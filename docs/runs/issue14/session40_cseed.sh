#!/bin/bash
# Session 40 (issue 14, seed 3 with today's preset): one whole sweep a GPU, each a (depth, lr, widths) chunk of the
# proxy grid at seed $SEED (the three formats unprotected and with policy: default, and fp32: 7 runs a width), on
# ONE machine of any GPU count (NAMED kind; carry ["devpack40"] on a fresh machine, none while warm).
#   SEED=3 MPS=1 bash cseed40.sh  (copied to the repository root: the device carries the working tree) 3:3e-4:256,384,512 3:6e-4:256,384,512 ...   (spec i runs on GPU i; at most one a GPU)
# Binaries: devpack40/a.txz (dist/bin keel-train keeld keel-worker keel + dist/lib), built from main (COMMIT).
# Each sweep's files go to $OUT as its own tarball the moment it ends (a call cut short keeps what finished).
set -u
SEED=${SEED:?SEED=3}
DL=${DEADLINE:-530}
O=$OUT; mkdir -p /tmp/k data
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
tarfile.open(fileobj=lzma.open('devpack40/a.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
NG=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack40/COMMIT 2>/dev/null)"; } >> $O/gpu.txt
[ $# -le $NG ] || { echo "$# specs for $NG GPUs" | tee $O/error.txt; exit 3; }
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe; mkdir -p $CUDA_MPS_PIPE_DIRECTORY /tmp/mps-log
  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log nvidia-cuda-mps-control -d >> $O/gpu.txt 2>&1; echo "mps-control rc=$?" >> $O/gpu.txt
fi
PIDS=""; g=0
for spec in "$@"; do
  IFS=: read -r L LR W <<< "$spec"
  n=grid-n$L-lr$LR-w${W//,/-}-seed$SEED
  runs=$(( 7 * $(echo "$W" | tr ',' '\n' | wc -l) ))
  share=$(python3 -c "print(min(0.25, int(1000 / $runs) / 1000))")
  od=/tmp/o-$n; mkdir -p $od
  ( python3 scripts/policy-grid gen --name $n --layers $L --widths $W --lrs $LR --seeds $SEED --gpus $share -o /tmp/$n.yaml \
      && cp /tmp/$n.yaml $od/ \
      && python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $od \
           --port $((7391 + g)) --deadline-s $DL --worker-args "--gpus $g" > $od/$n-run.log 2>&1
    echo "rc=$?" >> $od/$n-run.log
    tar -C /tmp -czf $O/$n.tgz o-$n ) & PIDS="$PIDS $!"
  g=$((g + 1))
done
wait $PIDS
[ "${MPS:-0}" = 1 ] && { echo quit | nvidia-cuda-mps-control >> $O/gpu.txt 2>&1; }
for f in /tmp/o-grid-*/grid-*-run.log; do echo "$f: $(tail -2 $f | head -1)"; done
