#!/usr/bin/env bash
# keeld answers a third-party client: Debian's python3-grpcio with stubs that
# protoc (messages) and grpc_tools (services) generate from proto/keel.proto.
set -euo pipefail
work="${TEST_TMPDIR:-/tmp}/python_client"
rm -rf "$work" && mkdir -p "$work/stubs"
protoc -I. --python_out="$work/stubs" proto/keel.proto
/usr/bin/python3 -m grpc_tools.protoc -I. --grpc_python_out="$work/stubs" proto/keel.proto
for std in health reflection; do
  protoc -I. --python_out="$work/stubs" tests/python/grpc_std/$std.proto
  /usr/bin/python3 -m grpc_tools.protoc -I. --grpc_python_out="$work/stubs" tests/python/grpc_std/$std.proto
done
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
metrics_port=$(free_port)
export KEEL_USER_TOKENS=python-user-token-0123456789
export KEEL_WORKER_TOKEN=python-worker-token-0123456789
server/keeld --listen "127.0.0.1:$port" --state-dir "$work/state" --metrics-listen "127.0.0.1:$metrics_port" \
  2> "$work/keeld.log" &
keeld=$!
trap 'kill $keeld 2>/dev/null || true' EXIT
/usr/bin/python3 tests/python/keel_client.py "$work/stubs" "127.0.0.1:$port" "$KEEL_USER_TOKENS"
# Prometheus: keeld's exporter counts the 3 queued runs the client submitted.
fetch="import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$metrics_port/metrics').read().decode())"
metrics=""
for _ in $(seq 30); do
  metrics=$(/usr/bin/python3 -c "$fetch" 2>/dev/null || true)
  grep -q '^keel_runs{state="QUEUED"} 3' <<< "$metrics" && break
  sleep 0.2
done
echo "$metrics" | grep '^keel_runs{state="QUEUED"} 3' || { echo "FAIL: /metrics lacks 3 queued runs"; echo "$metrics"; exit 1; }
for want in '^keel_sweeps 1' '^keel_queue_depth 3' 'keel_rpc_duration_seconds_count{code="OK",method="SubmitSweep"} 1' \
            'keel_rpc_duration_seconds_count{code="INVALID_ARGUMENT",method="SubmitSweep"} 1' '^keel_metric_points_ingested_total 0' \
            'keel_run_info{precision="fp32",run="run-2",state="QUEUED",sweep="sweep-1",worker=""} 1' \
            '^keel_store_write_duration_seconds_count [1-9]'; do
  grep -q -- "$want" <<< "$metrics" || { echo "FAIL: /metrics lacks $want"; echo "$metrics" | grep -v '^#'; exit 1; }
done
