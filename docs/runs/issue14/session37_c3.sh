#!/bin/bash
# Session 37, call 3 (kind nvidia-h200-x2, NAMED, right after call 2): today's preset on seed 1 at lr 6e-4, depths 3 and 4
# (GPU 0, 18 runs) and 6 and 8 (GPU 1, 18 runs), policy runs only (twins and references: sessions 34-36's sweeps).
set -u
test -e /tmp/k/dist/bin/keeld || python3 -c "import lzma,tarfile
for p in ('devpack37a/a.txz', 'devpack37s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')" \
  || { echo "machine not warm and no packs carried"; exit 3; }
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
O=$OUT; OUT=/tmp/o3; mkdir -p $OUT
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader > $OUT/gpu.txt
grid() {  # name, port, gpu, gen args...
  local n=$1 port=$2 gpu=$3; shift 3
  python3 scripts/policy-grid gen --name $n "$@" -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --port $port --deadline-s 530 --worker-args "--gpus $gpu" > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
  python3 scripts/policy-grid report $OUT/$n-runs.jsonl --series $OUT/$n-series.csv.gz -o $OUT/$n-report.md > /dev/null 2>&1
}
grid grid-k-lr6e-4-d34-seed1 7391 0 --layers 3,4 --widths 256,384,512 --lrs 6e-4 --seeds 1 --policy-only --gpus 0.05 & P1=$!
grid grid-k68-lr6e-4-seed1 7392 1 --layers 6,8 --widths 256,384,512 --lrs 6e-4 --seeds 1 --policy-only --gpus 0.05 & P2=$!
wait $P1 $P2
tar -C /tmp -czf $O/c3.tgz o3
for n in grid-k-lr6e-4-d34-seed1 grid-k68-lr6e-4-seed1; do tail -2 $OUT/$n-run.log; done
sed -n '1,/## Per configuration/p' $OUT/grid-k68-lr6e-4-seed1-report.md | head -9
