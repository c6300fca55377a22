#!/bin/bash
# Session 30 plan, call A (nvidia-h200-x4, carry ["devpack"]: k.txz = keel-train 230b325 + libs +
# BPE, train.00.txt.xz, val.txt.xz): unpack into /tmp for call B, which must follow at once.
set -eu
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/k.txz')).extractall('/tmp')"
mkdir -p /tmp/corpus && cp devpack/train.00.txt.xz devpack/val.txt.xz /tmp/corpus/
nvidia-smi --query-gpu=index,name --format=csv,noheader | tee $OUT/gpus.txt
