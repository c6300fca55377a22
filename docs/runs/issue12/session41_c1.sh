#!/bin/bash
# Planned in session 40 for session 41 (not yet run): one GPU is enough. Three calls, MODE=checks | speed | mps.
# Prepare here: scripts/dist --pack pack/dist.txz --only //kernels:nn_cuda_test //bench:train_bench
#   //worker/engine:keel-train //server:keeld //worker/agent:keel-worker //client:keel (about 35 MB: the carry's
#   64 MiB count the tracked files too); scripts/fetch-llmc .llmc; scripts/prepare-fortunes; move
#   docs/runs/issue14/*-series.csv.xz aside (docs/gpu.md); cp this file to the repository root; carry
#   ["pack", ".llmc", "data"] on a fresh machine.
# MODE=checks (about 5 minutes):
#   1. nn_cuda_test whole (first runs: MxKeptXGivesTheBitsAndStatsOfQuantizingAgain, FlashOnePassForward...,
#      CublasLtGeluEpilogueIsTheTanhApproximation).
#   2. train_bench A/B of mx_keep_x (off, on, off, on): gpt2-124m mxfp8_e4m3 and mxfp4 at B16, ms/step and peak;
#      and of flash_one_pass (bf16, mxfp8_e4m3).
#   3. The MX head's chunk: train_bench --head-chunk-mib 1024 (the default), 512, 256 (mxfp8_e4m3).
# MODE=speed: bench/speed against llm.c (the headline line; session 40's head change lowered bf16's peak).
# MODE=mps: keel-worker --mps on a GPU, grid k-check's cell again (seed 1, (3, 512, 1e-3), E4M3: plain, policy,
#   fp32 beside 0 other runs); expected, from grids k-check and mps-check: plain blow-up 7030, final
#   0.04833713481937454; policy final 0.0021699234352889167; fp32 blow-up 6375, final 0.017239375333070166; and no
#   MPS daemon left after the worker exits.
# Each result goes into $OUT as it comes (a call cut short keeps what finished).
set -u
MODE=${MODE:-checks}
mkdir -p /tmp/k
test -e /tmp/k/dist/bin || python3 -c "import lzma,tarfile; tarfile.open(fileobj=lzma.open('pack/dist.txz')).extractall('/tmp/k')"
export LD_LIBRARY_PATH=/tmp/k/dist/lib
B=/tmp/k/dist/bin
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader; echo "build $(cat pack/dist.txz.commit) mode $MODE"; } >> $OUT/gpu.txt
if [ "$MODE" = checks ]; then
  timeout 150 $B/nn_cuda_test > $OUT/nn_cuda_test.txt 2>&1; echo "nn_cuda_test rc=$?" >> $OUT/checks.txt
  grep -E "^\[  (PASSED|FAILED)|FAILED  \]|MxKeptX|FlashOnePass|CublasLtGelu|GELU epilogue|one pass against" \
    $OUT/nn_cuda_test.txt >> $OUT/checks.txt
  for mode in off on off on; do
    echo "== mx_keep_x $mode" >> $OUT/ab.txt
    if [ $mode = on ]; then export KEEL_CUDA_ON=mx_keep_x; else unset KEEL_CUDA_ON; fi
    timeout 80 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3,mxfp4 2>&1 | grep "ms/step" >> $OUT/ab.txt
  done
  for mode in off on off on; do
    echo "== flash_one_pass $mode" >> $OUT/ab.txt
    if [ $mode = on ]; then export KEEL_CUDA_ON=flash_one_pass; else unset KEEL_CUDA_ON; fi
    timeout 80 $B/train_bench --only gpt --steps 10 --schemes bf16,mxfp8_e4m3 2>&1 | grep "ms/step" >> $OUT/ab.txt
  done
  unset KEEL_CUDA_ON
  for mib in 1024 512 256; do
    echo "== --head-chunk-mib $mib" >> $OUT/ab.txt
    timeout 60 $B/train_bench --only gpt --steps 10 --schemes mxfp8_e4m3 --head-chunk-mib $mib 2>&1 | grep "ms/step" >> $OUT/ab.txt
  done
  cat $OUT/checks.txt $OUT/ab.txt
elif [ "$MODE" = speed ]; then
  timeout 540 python3 bench/speed --bin $B --llmc .llmc --steps 10 --out /tmp/speed > $OUT/speed.log 2>&1
  echo "speed rc=$?" >> $OUT/speed.log
  cp /tmp/speed/summary.txt $OUT/speed_summary.txt 2>/dev/null; cp /tmp/speed/commands.txt $OUT/speed_commands.txt 2>/dev/null
  tail -16 $OUT/speed_summary.txt 2>/dev/null
else
  n=grid-mps-worker-d3w512
  python3 scripts/policy-grid gen --name $n --layers 3 --widths 512 --lrs 1e-3 --seeds 1 --formats mxfp8_e4m3 \
    --gpus 0.045 -o /tmp/$n.yaml && cp /tmp/$n.yaml $OUT/
  timeout 520 python3 scripts/policy-grid run --bin $B --sweep /tmp/$n.yaml --dir /tmp/gs-$n --out $OUT \
    --deadline-s 480 --worker-args "--gpus 0 --mps" > $OUT/$n-run.log 2>&1
  echo "rc=$?" >> $OUT/$n-run.log
  { echo "MPS processes left after the worker exited:"; pgrep -a -f nvidia-cuda-mps || echo none; } >> $OUT/$n-run.log
  grep -h "mps\|MPS" /tmp/gs-$n/worker.log >> $OUT/$n-run.log 2>/dev/null
  tail -5 $OUT/$n-run.log
  python3 - "$OUT/$n-runs.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["format"], "policy" if r["events"] or r["first_action_step"] is not None else "-", r["blowup_step"], repr(r["final_loss"]))
PY
fi
echo "seconds $SECONDS"
