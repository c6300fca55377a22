#!/bin/bash
# Device run 6: the canonical unstable MXFP8 proxy run, three seeds: unprotected, the tuned
# policy, policy: default (probation after 1000), and fp32 as the reference.
[ -x dist/bin/keel-train ] || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('devpack/all.txz')).extractall('.')"
export LD_LIBRARY_PATH=$PWD/dist/lib
W=/tmp/policy-runs; rm -rf $W; mkdir -p $W $OUT/events
for seed in 1337 1 2; do
  for cfg in plain:proxy_mxfp8_e4m3 tuned:proxy_mxfp8_e4m3_policy_tuned default:proxy_mxfp8_e4m3_policy_default fp32:proxy_mxfp8_e4m3; do
    name=${cfg%%:*}; file=examples/${cfg#*:}.yaml
    extra=(); [ $name = fp32 ] && extra=(--set precision=fp32)
    start=$(date +%s.%N)
    dist/bin/keel-train --config $file --set seed=$seed "${extra[@]}" --run-dir $W/$name-$seed --quiet > $W/$name-$seed.log 2>&1
    rc=$?; end=$(date +%s.%N)
    echo "$name $seed rc=$rc wall_s=$(python3 -c "print(round($end-$start,1))")" >> $OUT/runs.txt
    cp $W/$name-$seed/events.jsonl $OUT/events/$name-$seed.jsonl 2>/dev/null
  done
done
python3 - "$W" > $OUT/summary.txt <<'PY'
import json,sys,os,glob
W=sys.argv[1]
rows=[]
for d in sorted(glob.glob(W+'/*-*')):
    if not os.path.isdir(d): continue
    name=os.path.basename(d)
    lines=open(d+'/metrics.jsonl').read().splitlines()
    last=json.loads(lines[-1]) if lines else {}
    losses=[json.loads(l).get('loss') for l in lines]
    peak=max((x for x in losses if x==x), default=float('nan'))
    tail=[x for x in losses[-200:] if x is not None]
    ev=[json.loads(l) for l in open(d+'/events.jsonl')] if os.path.exists(d+'/events.jsonl') else []
    kinds={}
    for e in ev: kinds[e.get('kind')]=kinds.get(e.get('kind'),0)+1
    print(f"{name:14s} steps {last.get('step')} final_loss {last.get('loss')} mean_last200 {sum(tail)/max(1,len(tail)):.6g} peak {peak:.4g} scheme {last.get('scheme')} events {kinds}")
PY
cat $OUT/runs.txt $OUT/summary.txt
