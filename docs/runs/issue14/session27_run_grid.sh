#!/bin/bash
# Session 27: one slice of issue 14's policy grid through keeld and keel-worker on this GPU.
#   bash devpack/run_grid.sh NAME DEADLINE_S
[ -d dist/bin ] || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/$1-gpu.txt
python3 scripts/policy-grid run --bin dist/bin --sweep devpack/$1.yaml --dir /tmp/$1 --out $OUT --deadline-s $2 > $OUT/$1-run.log 2>&1
echo "rc=$?" >> $OUT/$1-run.log
tail -8 $OUT/$1-run.log
