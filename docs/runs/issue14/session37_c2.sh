#!/bin/bash
# Session 37, call 2 (kind nvidia-h200-x2, NAMED; carry ["devpack37a", "devpack37s"] unless warm): today's preset
# (rollback 2 S, lr_fallbacks 3) on seed 1 at lr 1e-3, depths 6 and 8. Policy runs only (their unprotected twins and fp32
# references: sessions 34-36's sweeps; call 1 checked that this build's runs are bit-identical with session 36's), except
# the one cell no earlier sweep of this lineage ran whole (depth 6, width 384, lr 1e-3: plain, default and fp32).
# Depth 6 on GPU 0 (13 runs), depth 8 on GPU 1 (9 runs). One tarball back.
set -u
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack37a/a.txz', 'devpack37s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')" \
  || { echo "machine not warm and no packs carried"; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
O=$OUT; OUT=/tmp/o2; mkdir -p $OUT
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
grid() {  # name, port, gpu, gen args...
  local n=$1 port=$2 gpu=$3; shift 3
  python3 scripts/policy-grid gen --name $n "$@" -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --port $port --deadline-s 540 --worker-args "--gpus $gpu" > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
  python3 scripts/policy-grid report $OUT/$n-runs.jsonl --series $OUT/$n-series.csv.gz -o $OUT/$n-report.md > /dev/null 2>&1
}
grid grid-k6-lr1e-3-seed1 7391 0 --layers 6 --widths 256,512 --lrs 1e-3 --seeds 1 --policy-only --gpus 0.07 & P1=$!
grid grid-k6-w384-lr1e-3-seed1 7392 0 --layers 6 --widths 384 --lrs 1e-3 --seeds 1 --gpus 0.07 & P2=$!
grid grid-k8-lr1e-3-seed1 7393 1 --layers 8 --widths 256,384,512 --lrs 1e-3 --seeds 1 --policy-only --gpus 0.1 & P3=$!
wait $P1 $P2 $P3
tar -C /tmp -czf $O/c2.tgz o2
for n in grid-k6-lr1e-3-seed1 grid-k6-w384-lr1e-3-seed1 grid-k8-lr1e-3-seed1; do tail -2 $OUT/$n-run.log; done
sed -n '1,/## Per configuration/p' $OUT/grid-k6-w384-lr1e-3-seed1-report.md | head -9
