#!/usr/bin/env bash
# keel-train --nproc N as a user runs it: N rank processes over TCP on loopback.
#  - 2 ranks give the losses of one rank with grad_accum 2 (within 1e-5: see
#    ranks_test.cc for why not always bit for bit), and one metrics line per step;
#  - kill -9 of one rank: the launcher stops the other and fails quickly, and
#    the run resumed from its newest checkpoint ends with the uninterrupted loss;
#  - SIGINT: every rank stops after the same step, rank 0 checkpoints, exit 130;
#    so does a SIGTERM that lands on one rank between the ranks' stop vote and
#    the end of the step (a test hook raises it there);
#  - dist.listen_host 0.0.0.0: rank 0 reached at its dist.advertise_host;
#  - flags that cannot work are refused (exit 2); CUDA ranks without a GPU fail at once.
set -euo pipefail
train="$PWD/worker/engine/keel-train"
work="${TEST_TMPDIR:-/tmp}/nproc"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cat > run.yaml <<'YAML'
name: nproc
model: {type: proxy, layers: 2, width: 32}
precision: mxfp8_e4m3
batch: 64
steps: 12
seed: 5
threads: 1
check_every: 1
optimizer: {type: adam, lr: 0.003}
YAML
losses() { /usr/bin/python3 -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1])))' "$1"; }
close() {  # close A B: equal length, every loss within 1e-5 relative
  /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
assert len(a) == len(b), (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert abs(x - y) <= 1e-5 * abs(y), (i + 1, x, y)
print("%d steps within 1e-5%s" % (len(a), " (bit-identical)" if a == b else ""))
PY
}

# 1. Two ranks against one rank with grad_accum 2.
"$train" --config run.yaml --run-dir one --set grad_accum=2 --quiet
"$train" --config run.yaml --run-dir two --nproc 2 2> two.log
grep -q "ranks 0-1 of 2 on this host" two.log
[ "$(wc -l < two/metrics.jsonl)" = 12 ] || { echo "two ranks wrote $(wc -l < two/metrics.jsonl) metric lines, want 12"; exit 1; }
close "$(losses two/metrics.jsonl)" "$(losses one/metrics.jsonl)"
[ ! -e two/ranks/bootstrap ] || { echo "the bootstrap file outlived the run"; exit 1; }

# 2. kill -9 of rank 1 mid-run.
"$train" --config run.yaml --run-dir whole --set steps=400 --set checkpoint_every=50 --nproc 2 --quiet
"$train" --config run.yaml --run-dir killed --set steps=400 --set checkpoint_every=50 --nproc 2 --quiet 2> killed.log &
launcher=$!
for _ in $(seq 300); do [ -d killed/checkpoints/step_00000050 ] && break; sleep 0.1; done
[ -d killed/checkpoints/step_00000050 ] || { echo "no checkpoint at step 50"; cat killed.log; exit 1; }
ranks=$(pgrep -P "$launcher" | tr '\n' ' ')
rank1=$(echo $ranks | cut -d' ' -f2)
[ -n "$rank1" ] || { echo "no second rank under the launcher"; exit 1; }
kill -9 "$rank1"
start=$(date +%s)
status=0
wait "$launcher" || status=$?
[ "$status" -ne 0 ] || { echo "the launcher exited 0 after a rank was killed"; exit 1; }
[ $(( $(date +%s) - start )) -lt 60 ] || { echo "the launcher took too long to stop"; exit 1; }
grep -q "rank 1 died of signal 9; stopping the other ranks" killed.log || { cat killed.log; exit 1; }
for pid in $ranks; do ! kill -0 "$pid" 2> /dev/null || { echo "rank process $pid outlived the launcher"; exit 1; }; done
"$train" --config run.yaml --run-dir killed --set steps=400 --set checkpoint_every=50 --nproc 2 --resume latest --quiet
final() { tail -n 1 "$1" | /usr/bin/python3 -c 'import json,sys; l=json.loads(sys.stdin.read()); print(l["step"], repr(l["loss"]))'; }
[ "$(final killed/metrics.jsonl)" = "$(final whole/metrics.jsonl)" ] || {
  echo "resumed: $(final killed/metrics.jsonl), uninterrupted: $(final whole/metrics.jsonl)"; exit 1; }

# 3. SIGINT: every rank stops after the same step; rank 0 checkpoints; exit 130.
"$train" --config run.yaml --run-dir interrupted --set steps=100000 --nproc 2 --quiet 2> int.log &
launcher=$!
for _ in $(seq 300); do [ -s interrupted/metrics.jsonl ] && break; sleep 0.1; done
kill -INT "$launcher"
status=0
wait "$launcher" || status=$?
[ "$status" = 130 ] || { echo "SIGINT: exit $status, want 130"; cat int.log; exit 1; }
ls interrupted/checkpoints | grep -q step_ || { echo "no checkpoint after SIGINT"; exit 1; }

# 3b. SIGTERM on rank 1 right after its stop vote of step 3 (the test hook in
# trainer.cc): the vote said "go on", so both ranks train step 4, vote to stop
# and stop there together; rank 0 checkpoints step 4; exit 130.
status=0
KEEL_TEST_SIGNAL_AFTER_VOTE=1:3 timeout 120 "$train" --config run.yaml --run-dir late --set steps=100000 --nproc 2 \
  --quiet 2> late.log || status=$?
[ "$status" = 130 ] || { echo "SIGTERM after the vote: exit $status, want 130"; cat late.log; exit 1; }
grep -qF "interrupted (signal 15) after step 4" late.log || { echo "rank 1 did not stop after step 4:"; cat late.log; exit 1; }
grep -qF "rank 0 stopped after step 4 with the other ranks" late.log || {
  echo "rank 0 did not stop after step 4:"; cat late.log; exit 1; }
[ "$(wc -l < late/metrics.jsonl)" = 4 ] || { echo "SIGTERM after the vote: $(wc -l < late/metrics.jsonl) metric lines, want 4"; exit 1; }
[ "$(ls late/checkpoints)" = step_00000004 ] || { echo "checkpoints after SIGTERM: $(ls late/checkpoints), want step_00000004"; exit 1; }

# 3c. Rank 0 on every interface (dist.listen_host 0.0.0.0), publishing
# 127.0.0.2, which a socket bound to 127.0.0.1 (the default) never answers.
"$train" --config run.yaml --run-dir wide --set steps=3 --set dist.listen_host=0.0.0.0 \
  --set dist.advertise_host=127.0.0.2 --nproc 2 --quiet
[ "$(wc -l < wide/metrics.jsonl)" = 3 ] || { echo "listen_host 0.0.0.0: $(wc -l < wide/metrics.jsonl) metric lines, want 3"; exit 1; }

# 4. Refusals.
expect_refused() {  # expect_refused MESSAGE ARGS...
  local message=$1 status=0
  shift
  "$train" --config run.yaml --run-dir refused "$@" 2> refused.log || status=$?
  [ "$status" = 2 ] || { echo "$*: exit $status, want 2"; cat refused.log; exit 1; }
  grep -qF -- "$message" refused.log || { echo "$*: want '$message' in:"; cat refused.log; exit 1; }
}
# CUDA ranks on this (GPU-less) host: a build without CUDA refuses them up
# front (exit 2); a CUDA build starts them and each rank fails to find a GPU
# (exit 1). Either way, at once and saying why.
status=0
timeout 60 "$train" --config run.yaml --run-dir refused --nproc 2 --backend cuda 2> cuda.log || status=$?
case "$status" in
  2) grep -qF "more than one rank on the cuda backend needs the NCCL communicator, which this build does not have" cuda.log ;;
  1) grep -qF "no CUDA GPU visible" cuda.log ;;
  *) false ;;
esac || { echo "--nproc 2 --backend cuda: exit $status, want 2 (no NCCL) or 1 (no GPU):"; cat cuda.log; exit 1; }
expect_refused "--rank and --world go together" --rank 1
expect_refused "--rank: 2 is not allowed (0 .. --world - 1 = 1)" --rank 2 --world 2 --bootstrap b
expect_refused "--bootstrap: missing" --rank 0 --world 2
expect_refused "dist.listen_host: '10.0.0.1:7000' is not allowed" --nproc 2 --set dist.listen_host=10.0.0.1:7000
expect_refused "dist.advertise_host: '0.0.0.0' is not allowed" --nproc 2 --set dist.advertise_host=0.0.0.0
expect_refused "--nproc: auto is not allowed with backend cpu" --nproc auto
expect_refused "--nproc: 0 is not allowed (allowed: a number 1..1024, or auto)" --nproc 0
expect_refused "--nproc: 2x is not allowed" --nproc 2x
# auto on the cuda backend: one rank per visible GPU; with none visible here it
# says so (a build with CUDA on this GPU-less host, or hiding every GPU).
status=0
CUDA_VISIBLE_DEVICES= timeout 60 "$train" --config run.yaml --run-dir refused --nproc auto --backend cuda 2> auto.log || status=$?
[ "$status" = 2 ] && grep -qF -- "--nproc: auto found no visible GPU" auto.log ||
  { echo "--nproc auto --backend cuda with no GPU: exit $status, want 2:"; cat auto.log; exit 1; }
echo "nproc_test: ok"
