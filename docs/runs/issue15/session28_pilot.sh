#!/bin/bash
# Session 28 device call (issue 15 pilot): GPT-2 BPE tokenization of one corpus part on the GPU
# machine, then the throughput of the llama and gla models at two sizes in bf16 and the CHON
# schemes (25 steps each), to size the CHON reproduction.
set -u
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('/tmp/pk')"
export LD_LIBRARY_PATH=/tmp/pk/dist/lib
K=/tmp/pk/dist/bin/keel-train
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/pilot.txt
start=$(date +%s)
xz -dc devpack/train.01.txt.xz > /tmp/t.txt
$K prepare-text /tmp/t.txt /tmp/c --tokenizer gpt2 --bpe-dir /tmp/pk/bpe --val-fraction 0.01 2>&1 | tail -2 | tee -a $OUT/pilot.txt
echo "tokenized in $(( $(date +%s) - start )) s" | tee -a $OUT/pilot.txt
run() {  # name config-file scheme extra-sets...
  local name=$1 cfg=$2 scheme=$3; shift 3
  timeout 120 $K --config $cfg --steps 25 --quiet --run-dir /tmp/r-$name --set data.train=/tmp/c_train.bin \
    --set data.val=/tmp/c_val.bin --set precision=$scheme --set checkpoint_every=0 "$@" > /tmp/r-$name.log 2>&1
  echo "$name rc=$? $(python3 -c "
import json,statistics
L=[json.loads(l) for l in open('/tmp/r-$name/metrics.jsonl')]
t=[x['tokens_per_s'] for x in L[10:]]
print('steps %d tok/s median %.0f loss first %.3f last %.3f' % (len(L), statistics.median(t), L[0]['loss'], L[-1]['loss']))
" 2>&1 | tail -1)" | tee -a $OUT/pilot.txt
}
for m in llama gla; do
  for s in bf16 nvfp4_recipe chon; do run $m-124m-$s examples/${m}_124m.yaml $s; done
  run $m-d512L8-bf16 examples/${m}_124m.yaml bf16 --set model.width=512 --set model.layers=8
  run $m-d512L8-chon examples/${m}_124m.yaml chon --set model.width=512 --set model.layers=8
done
tail -3 /tmp/r-gla-124m-chon.log >> $OUT/pilot.txt
