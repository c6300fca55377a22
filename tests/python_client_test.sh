#!/usr/bin/env bash
# keeld answers a third-party client: Debian's python3-grpcio with stubs that
# protoc (messages) and grpc_tools (services) generate from proto/keel.proto.
set -euo pipefail
work="${TEST_TMPDIR:-/tmp}/python_client"
rm -rf "$work" && mkdir -p "$work/stubs"
protoc -I. --python_out="$work/stubs" proto/keel.proto
/usr/bin/python3 -m grpc_tools.protoc -I. --grpc_python_out="$work/stubs" proto/keel.proto
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export KEEL_USER_TOKENS=python-user-token-0123456789
export KEEL_WORKER_TOKEN=python-worker-token-0123456789
server/keeld --listen "127.0.0.1:$port" --state-dir "$work/state" --metrics-listen off 2> "$work/keeld.log" &
keeld=$!
trap 'kill $keeld 2>/dev/null || true' EXIT
/usr/bin/python3 tests/python/keel_client.py "$work/stubs" "127.0.0.1:$port" "$KEEL_USER_TOKENS"
