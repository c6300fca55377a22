#!/bin/bash
# Session 38, call 2 (kind nvidia-h100-x4, NAMED; carry ["devpack38a", "devpack38s"]). Call 1's whole-cell check
# at (8, 512, lr 3e-4, E2M3) did NOT reproduce grid g8 (session 34's build 0d03268: its plain run blew up at 3755,
# this build's did not), so grid g's twins are not this build's: this call runs the unprotected twins and fp32
# references of all 12 lr-3e-4 cells (gen --twins-only: 3 formats + fp32 = 48 runs) for grids l's policy runs.
# The E2M3 / fp32 runs at (8, 512) ran in call 1 too: they must come out the same (determinism across machines).
# GPU g runs depth {3,4,6,8}[g]: 12 runs a GPU. ONE tarball back ($OUT/c2.tgz).
set -u
O=$OUT; OUT=/tmp/o2; mkdir -p $OUT /tmp/k
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack38a/a.txz', 'devpack38s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack38a/COMMIT)"; } > $OUT/gpu.txt
grid() {  # name, port, gpus, deadline, gen args...
  local n=$1 port=$2 gpus=$3 dl=$4; shift 4
  python3 scripts/policy-grid gen --name $n "$@" -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --port $port --deadline-s $dl --worker-args "--gpus $gpus" > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
}
PIDS=""
g=0
for L in 3 4 6 8; do
  grid grid-m$L-lr3e-4-seed1-twins $((7391 + g)) $g 530 --layers $L --widths 256,384,512 --lrs 3e-4 --seeds 1 --twins-only --gpus 0.08 & PIDS="$PIDS $!"
  g=$((g + 1))
done
wait $PIDS
tar -C /tmp -czf $O/c2.tgz o2
for f in $OUT/grid-*-run.log; do echo "$f: $(tail -2 $f | head -1)"; done
