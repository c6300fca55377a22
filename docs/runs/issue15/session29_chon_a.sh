#!/bin/bash
# Session 29 CHON reproduction, call A (4 GPUs of one host): unpack keel-train (230b325), its
# libraries and GPT-2's BPE files into /tmp/k, and keep the first corpus part and the validation
# text in /tmp/corpus for call B (one call cannot carry both parts beside the tracked files).
set -eu
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/k.txz')).extractall('/tmp')"
mkdir -p /tmp/corpus && cp devpack/train.00.txt.xz devpack/val.txt.xz /tmp/corpus/
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee $OUT/gpus.txt
ls -la /tmp/corpus /tmp/k/dist/bin
