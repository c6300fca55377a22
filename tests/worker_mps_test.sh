#!/usr/bin/env bash
# keel-worker --mps through a real keeld: the worker starts the MPS control
# daemon (-d) with its pipe and log directories under <work-dir>/mps/ before its
# first run, the trainer it starts has CUDA_MPS_PIPE_DIRECTORY in its
# environment, and the worker tells the daemon to quit when it stops. CI has no
# GPU and no MPS: the control is a stand-in that records its calls, and the GPU a
# fake one (the run trains on the CPU). Flag errors: --mps with --no-gpus, and
# --mps-control without --mps.
set -euo pipefail
work="${TEST_TMPDIR:-/tmp}/worker_mps"
rm -rf "$work" && mkdir -p "$work"
root=$PWD
fail() { echo "FAIL: $*"; for f in "$work"/*.log "$work"/record.txt; do [ -f "$f" ] && { echo "== $f"; cat "$f"; }; done; exit 1; }

set +e
worker/agent/keel-worker --no-gpus --mps > /dev/null 2> "$work/flags1.log"; rc1=$?
worker/agent/keel-worker --mps-control /bin/true > /dev/null 2> "$work/flags2.log"; rc2=$?
set -e
[ "$rc1" = 2 ] && grep -q -- "--mps: not allowed with --no-gpus" "$work/flags1.log" || fail "--mps --no-gpus gave exit $rc1"
[ "$rc2" = 2 ] && grep -q -- "--mps-control: not allowed without --mps" "$work/flags2.log" || fail "--mps-control alone gave exit $rc2"

# The stand-in control: records "args=... pipe=... stdin=..." and exits 0.
cat > "$work/mps-control" <<SH
#!/bin/sh
in=\$(cat)
echo "args=\$* pipe=\$CUDA_MPS_PIPE_DIRECTORY stdin=\$in" >> "$work/record.txt"
SH
chmod +x "$work/mps-control"

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export KEEL_USER_TOKENS=mps-user-token-0123456789
export KEEL_WORKER_TOKEN=mps-worker-token-0123456789
export KEEL_TOKEN=$KEEL_USER_TOKENS
export KEEL_SERVER="127.0.0.1:$port"
server/keeld --listen "$KEEL_SERVER" --state-dir "$work/state" --metrics-listen off 2> "$work/keeld.log" &
pids=($!)
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq 50); do client/keel sweeps > /dev/null 2>&1 && break; sleep 0.2; done

worker/agent/keel-worker --server "$KEEL_SERVER" --trainer "$root/worker/engine/keel-train" --work-dir "$work/w" \
  --fake-gpus 1 --mps --mps-control "$work/mps-control" --metrics-listen off 2> "$work/worker.log" &
worker=$!
pids+=($worker)
pipe="$work/w/mps/pipe"
for _ in $(seq 50); do [ -s "$work/record.txt" ] && break; sleep 0.1; done
[ "$(head -1 "$work/record.txt")" = "args=-d pipe=$pipe stdin=" ] || fail "the daemon was not started with -d and $pipe"

# A long run on the fake GPU (a quarter of it): its trainer must see the pipe directory.
cat > "$work/sweep.yaml" <<'YAML'
name: mps
base:
  model: {type: proxy, layers: 1, width: 16}
  batch: 32
  steps: 1000000
  threads: 1
resources: {gpus: 0.25}
YAML
client/keel submit "$work/sweep.yaml" > "$work/submit.log"
trainer=""
for _ in $(seq 100); do
  trainer=$(pgrep -P "$worker" | head -1 || true)   # the worker's child (its own command line names keel-train too)
  [ -n "$trainer" ] && break
  sleep 0.1
done
[ -n "$trainer" ] || fail "no trainer started"
env_pipe=$(tr '\0' '\n' < "/proc/$trainer/environ" | sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p')
[ "$env_pipe" = "$pipe" ] || fail "the trainer's CUDA_MPS_PIPE_DIRECTORY is '$env_pipe', want $pipe"

kill -TERM "$worker"
wait "$worker" || true
[ "$(sed -n 2p "$work/record.txt")" = "args= pipe=$pipe stdin=quit" ] || fail "the worker did not tell the daemon to quit"
[ "$(wc -l < "$work/record.txt")" = 2 ] || fail "the control was called $(wc -l < "$work/record.txt") times, want 2"
echo "PASS: keel-worker --mps starts the daemon in its work dir, its trainer has the pipe directory, quit at exit"
