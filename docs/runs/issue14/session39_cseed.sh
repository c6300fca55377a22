#!/bin/bash
# Session 39+ (issue 14, seeds 2-3 with today's preset): one whole sweep a GPU, each a (depth, lr, widths) chunk of the
# proxy grid at seed $SEED (the three formats unprotected and with policy: default, and fp32: 7 runs a width), on
# ONE machine of any GPU count (NAMED kind; carry ["devpack39a", "devpack39s"] on a fresh machine, none while warm).
#   SEED=2 [MPS=1] bash cseed.sh 3:3e-4:256,384,512 3:6e-4:256,384,512 ...   (spec i runs on GPU i; at most one a GPU)
# Runs a sweep with more than 22 runs on one GPU would not finish: split the widths. ONE tarball back ($OUT/cseed.tgz).
set -u
SEED=${SEED:?SEED=2 or 3}
DL=${DEADLINE:-530}
O=$OUT; OUT=/tmp/oseed; mkdir -p $OUT /tmp/k data
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack39a/a.txz', 'devpack39s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
NG=$(nvidia-smi -L | wc -l)
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack39a/COMMIT 2>/dev/null)"; } >> $OUT/gpu.txt
[ $# -le $NG ] || { echo "$# specs for $NG GPUs" | tee $O/error.txt; exit 3; }
# MPS=1: every sweep's runs share their GPU through CUDA MPS (see c1.sh; quit at the end).
# MPS=worker: the same through keel-worker --mps (branch worker-mps, devpack39w: carry it, or have it extracted):
# each sweep's worker starts its own daemon for its GPU.
WARGS=""
if [ "${MPS:-0}" = worker ]; then
  test -e /tmp/k/dist/bin/keel-worker.main || cp /tmp/k/dist/bin/keel-worker /tmp/k/dist/bin/keel-worker.main
  python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack39w/w.txz')).extractall('/tmp/k')"
  WARGS=" --mps"
fi
if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe; mkdir -p $CUDA_MPS_PIPE_DIRECTORY /tmp/mps-log
  CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log nvidia-cuda-mps-control -d >> $OUT/mps.txt 2>&1; echo "mps-control rc=$?" >> $OUT/mps.txt
fi
PIDS=""; g=0
for spec in "$@"; do
  IFS=: read -r L LR W <<< "$spec"
  n=grid-n$L-lr$LR-w${W//,/-}-seed$SEED
  runs=$(( 7 * $(echo "$W" | tr ',' '\n' | wc -l) ))
  share=$(python3 -c "print(min(0.25, int(1000 / $runs) / 1000))")
  ( python3 scripts/policy-grid gen --name $n --layers $L --widths $W --lrs $LR --seeds $SEED --gpus $share -o /tmp/$n.yaml \
      && cp /tmp/$n.yaml $OUT/ \
      && python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
           --port $((7391 + g)) --deadline-s $DL --worker-args "--gpus $g$WARGS" > $OUT/$n-run.log 2>&1
    echo "rc=$?" >> $OUT/$n-run.log ) & PIDS="$PIDS $!"
  g=$((g + 1))
done
wait $PIDS
[ "${MPS:-0}" = 1 ] && { echo quit | nvidia-cuda-mps-control >> $OUT/mps.txt 2>&1; }
tar -C /tmp -czf $O/cseed.tgz oseed
for f in $OUT/grid-*-run.log; do echo "$f: $(tail -2 $f | head -1)"; done
