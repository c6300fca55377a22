#!/bin/bash
# Session 25, device run 7 (2 x H200): a 2-GPU gang and two 1-GPU runs submitted together to keeld.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/g.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib NCCL_NVLS_ENABLE=0
for g in 1 2; do sed -e "s|DEVROOT/|$PWD/|g" -e "s|steps: 300|steps: 3000|" devpack/sweep_gpus$g.yaml > /tmp/s$g.yaml; done
rm -rf /tmp/pack
timeout 280 python3 devpack/session25_pack.py dist/bin /tmp/s2.yaml /tmp/s1.yaml /tmp/pack
nvidia-smi --query-gpu=index,name --format=csv,noheader
