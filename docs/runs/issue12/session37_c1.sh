#!/bin/bash
# Session 37, call 1 (kind nvidia-h200-x2 (no 4-GPU kind lent today), NAMED; carry ["devpack37a", "devpack37s"]). Build: branch
# mx-head-held-weight (main + Backend::HoldWeight: the MX head's chunks quantize the head's weight once for
# their forwards and once for their dgrads; KEEL_CUDA_OFF=held_weight turns it off).
# GPU 0: nn_cuda_test (AHeldWeightIsQuantizedOnceWithTheBitsOfEveryChunk and AHeldBf16Weight... are new), trainer_parity_test
# (Gpt, GptHeadInChunks, Proxy, Llama, Gla), the held_weight A/B (MXFP8 GPT at 1 GiB and 512 MiB chunks, bf16;
# on/off/on/off; one piece for reference), a profile if time is left. GPU 1: today's preset (rollback 2 S, lr_fallbacks 3) on seed 1, lr 1e-3,
# depths 3 and 4, policy runs only (18), and a 3-run determinism check. Everything goes back as ONE tarball (the device returns at most 8 files).
set -u
O=$OUT; OUT=/tmp/o1; mkdir -p $OUT /tmp/k data
python3 -c "import lzma,tarfile
for p in ('devpack37a/a.txz', 'devpack37s/s.txz'): tarfile.open(fileobj=lzma.open(p)).extractall('/tmp/k')"
xz -dc devpack37a/fortunes_train.bin.xz > data/fortunes_train.bin
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat devpack37a/COMMIT)"; } > $OUT/gpu.txt
# GPU 1: today's preset only (--policy-only: the unprotected twins and fp32 references are those of sessions 34-36's
# sweeps, which agree bit for bit wherever they overlap), and beside it one whole cell (plain, default, fp32 at depth 3,
# width 512, lr 1e-3, E4M3) to check that this build's runs are bit-identical with session 36's (plain blew up at 7030,
# final 0.04833713481937454) and with the policy-only sweep's.
grid() {  # name, port, gen args...
  local n=$1 port=$2; shift 2
  python3 scripts/policy-grid gen --name $n "$@" -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --port $port --deadline-s 520 --worker-args '--gpus 1' > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
  python3 scripts/policy-grid report $OUT/$n-runs.jsonl --series $OUT/$n-series.csv.gz -o $OUT/$n-report.md > /dev/null 2>&1
}
name=grid-k-lr1e-3-d34-seed1
grid $name 7397 --layers 3,4 --widths 256,384,512 --lrs 1e-3 --seeds 1 --policy-only --gpus 0.045 &
GRID=$!
grid grid-k-check-d3w512 7398 --layers 3 --widths 512 --lrs 1e-3 --seeds 1 --formats mxfp8_e4m3 --gpus 0.045 &
CHECK=$!
export CUDA_VISIBLE_DEVICES=0
{ timeout 200 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?"
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/nn_cuda_test.txt
  grep -E "^\[ +(OK|FAILED) +\] NnCudaTest\.(AHeld|MxDownColumnsInTiles|KeelCudaOff|LinearMatchesCpu)" $OUT/nn_cuda_test.txt
  timeout 320 $B/trainer_parity_test > $OUT/parity.txt 2>&1; echo "parity rc=$?"
  grep -E "^(gpt|proxy|llama|gla) |OK \]|FAILED" $OUT/parity.txt
} > $OUT/checks.txt 2>&1
# 1024 MiB chunks (the default: 4 x 4,096 rows) and 512 MiB (8 x 2,048 rows: each chunk's dy small enough for
# dy_one_pass, so with the weight held these could beat one piece).
for mib in 1024 512; do
  for mode in on off on off; do
    if [ $mode = off ]; then export KEEL_CUDA_OFF=held_weight; else unset KEEL_CUDA_OFF; fi
    echo "== --head-chunk-mib $mib, held_weight $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
    timeout 60 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --head-chunk-mib $mib 2>&1 | grep "ms/step"
  done
done > $OUT/held_ab.txt 2>&1
# The BF16 head (chunks of 1 GiB since session 32): the first chunk's rounding of w kept for the rest.
for mode in on off on off; do
  if [ $mode = off ]; then export KEEL_CUDA_OFF=held_weight; else unset KEEL_CUDA_OFF; fi
  echo "== bf16, held_weight $mode (KEEL_CUDA_OFF=${KEEL_CUDA_OFF:-})"
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes bf16 2>&1 | grep "ms/step"
done >> $OUT/held_ab.txt 2>&1
unset KEEL_CUDA_OFF
for i in 1 2; do echo "== one piece (--head-chunk-mib 4096)"
  timeout 60 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --head-chunk-mib 4096 2>&1 | grep "ms/step"
done >> $OUT/held_ab.txt 2>&1
[ $SECONDS -lt 420 ] && timeout 90 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --profile > $OUT/profile_mxfp8.txt 2>&1
wait $GRID $CHECK
tar -C /tmp -czf $O/c1.tgz o1
cat $OUT/checks.txt $OUT/held_ab.txt; tail -3 $OUT/$name-run.log
sed -n '1,/## Per configuration/p' $OUT/$name-report.md | head -14
python3 - <<'PY'
import json
for f in ("/tmp/o1/grid-k-check-d3w512-runs.jsonl", "/tmp/o1/grid-k-lr1e-3-d34-seed1-runs.jsonl"):
    try:
        for l in open(f):
            r = json.loads(l)
            if r["layers"] == 3 and r["width"] == 512 and r["format"] in ("mxfp8_e4m3", "fp32"):
                print(f.split("/")[-1], r["variant"], r["format"], r["state"], r["blowup_step"], repr(r["final_loss"]))
    except OSError as e:
        print(e)
PY
