#!/bin/bash
# Session 25, device run 5 (2 x H200): the keeld gang sweeps again, with their failure reasons.
python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/g.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib NCCL_NVLS_ENABLE=0
sed -i "s|DEVROOT/|$PWD/|g" devpack/sweep_gpus*.yaml
pkill -f "dist/bin/keel" ; sleep 1
for g in 2 1; do
  rm -rf /tmp/gang$g /tmp/gangout$g
  timeout 250 python3 scripts/policy-grid run --bin dist/bin --sweep devpack/sweep_gpus$g.yaml --dir /tmp/gang$g --out /tmp/gangout$g --deadline-s 200 --port 739$g --worker-args "$WARGS" > /tmp/gang$g.txt 2>&1
  echo "== gang sweep gpus $g rc=$?"; tail -8 /tmp/gang$g.txt
  python3 -c "
import json
for l in open('/tmp/gangout$g/sweep_gpus$g-runs.jsonl'):
    r=json.loads(l); print({k: r.get(k) for k in sorted(r) if k in ('id','state','exit','message','restarts','final_loss','steps','error','reason','last_step')})
" 2>&1 | head -5
  for f in /tmp/gang$g/worker/runs/*/*.log /tmp/gang$g/worker/*/*.log /tmp/gang$g/worker/*/*/*.log; do [ -f $f ] && { echo "-- $f"; tail -6 $f; }; done 2>/dev/null | head -40
  tail -5 /tmp/gang$g/worker.log
done
