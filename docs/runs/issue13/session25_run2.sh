#!/bin/bash
# Session 25, device run 2 (2 x H200): NCCL two-rank tests, 1 vs 2 GPU scaling at GPT-2 124M (bf16, mxfp8; NVLink and sockets-only), keeld gang on real GPUs.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/g.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/summary.txt
timeout 90 dist/bin/nccl_comm_test 2>&1 | grep -E "OK \]|FAILED|PASSED|SKIPPED|Failure|rror" > $OUT/nccl.txt; echo "nccl_comm_test: $(grep -c 'OK \]' $OUT/nccl.txt) ok, $(grep -c 'FAILED  \]' $OUT/nccl.txt) failed lines" >> $OUT/summary.txt
scale() {  # $1 scheme, $2 nproc, $3 label, env in $ENVS
  d=/tmp/s_$1_$2_$3; rm -rf $d
  env $ENVS timeout 150 dist/bin/keel-train --config examples/gpt2_124m.yaml --set data.train=data/fortunes_train.bin --set data.val=data/fortunes_val.bin \
    --set data.eval_every=100000 --set steps=50 --set log_every=1 --set checkpoint_every=0 --set precision=$1 --nproc $2 --run-dir $d > $d.log 2>&1
  rc=$?
  python3 - "$1" "$2" "$3" "$d" "$rc" >> $OUT/summary.txt <<'PY'
import json,sys,statistics
s,n,label,d,rc=sys.argv[1:]
try:
  rows=[json.loads(l) for l in open(d+'/metrics.jsonl')]
  rows=[r for r in rows if 'step_ms' in r]
  ms=statistics.median(r['step_ms'] for r in rows[15:])
  tok=16*1024*int(n)/ms*1000
  print(f"scaling {s:12s} nproc {n} {label:8s} rc={rc} median step {ms:7.2f} ms  {tok:9.0f} tok/s  last loss {rows[-1].get('loss')}")
except Exception as e: print(f"scaling {s} nproc {n} {label} rc={rc}: no figures ({e})")
PY
  grep -E "comm|overlap" $d.log | tail -2 | sed "s/^/  $1 $2 $3: /" >> $OUT/summary.txt
  tail -3 $d.log > $OUT/tail_$1_$2_$3.txt
}
for s in bf16 mxfp8_e4m3; do ENVS= scale $s 1 nvlink; ENVS= scale $s 2 nvlink; done
ENVS="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket" scale bf16 2 sockets
ENVS="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket" scale mxfp8_e4m3 2 sockets
sed -i "s|DEVROOT/|$PWD/|" devpack/sweep_gpus*.yaml
for g in 2 1; do
  timeout 200 python3 scripts/policy-grid run --bin dist/bin --sweep devpack/sweep_gpus$g.yaml --dir /tmp/gang$g --out $OUT/gang$g --deadline-s 170 --port 739$g > $OUT/gang$g.txt 2>&1
  echo "gang sweep gpus $g rc=$?" >> $OUT/summary.txt; tail -4 $OUT/gang$g.txt >> $OUT/summary.txt
  grep -hE "rank|gang|NCCL|placed|assign" /tmp/gang$g/worker.log | head -8 >> $OUT/gang$g.txt
done
tar -C /tmp -czf $OUT/gang_logs.tgz gang1/keeld.log gang1/worker.log gang2/keeld.log gang2/worker.log 2>/dev/null
