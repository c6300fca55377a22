#!/usr/bin/env bash
# keeld over TLS with client certificates (--tls-cert/--tls-key/--tls-client-ca):
# the keel CLI and a keel-worker connect with the CA and their certificates;
# a client without a certificate, and a plaintext client, are refused.
set -euo pipefail
work="${TEST_TMPDIR:-/tmp}/tls"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
openssl_quiet() { openssl "$@" > /dev/null 2>&1; }
# A CA, a server certificate for 127.0.0.1, a client certificate.
openssl_quiet req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=keel test CA"
openssl_quiet req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1"
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > san.ext
openssl_quiet x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext
openssl_quiet req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=keel client"
openssl_quiet x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2
cd - > /dev/null

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export KEEL_USER_TOKENS=tls-user-token-0123456789
export KEEL_WORKER_TOKEN=tls-worker-token-0123456789
export KEEL_TOKEN=$KEEL_USER_TOKENS
export KEEL_SERVER="127.0.0.1:$port"
server/keeld --listen "$KEEL_SERVER" --state-dir "$work/state" --metrics-listen off \
  --tls-cert "$work/server.pem" --tls-key "$work/server.key" --tls-client-ca "$work/ca.pem" 2> "$work/keeld.log" &
pids=($!)
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
tls=(--tls-ca "$work/ca.pem" --tls-cert "$work/client.pem" --tls-key "$work/client.key")
for _ in $(seq 50); do client/keel sweeps "${tls[@]}" > /dev/null 2>&1 && break; sleep 0.2; done

client/keel sweeps "${tls[@]}"                      # with the CA and a client certificate: ok
set +e
client/keel sweeps --tls-ca "$work/ca.pem" > /dev/null 2>&1; no_cert=$?
client/keel sweeps > /dev/null 2>&1; plaintext=$?
client/keel sweeps --tls-cert "$work/client.pem" > /dev/null 2>&1; half=$?
set -e
[ "$no_cert" = 3 ] || { echo "FAIL: no client certificate gave exit $no_cert, want 3"; exit 1; }
[ "$plaintext" = 3 ] || { echo "FAIL: plaintext gave exit $plaintext, want 3"; exit 1; }
[ "$half" = 2 ] || { echo "FAIL: --tls-cert without --tls-key gave exit $half, want 2"; exit 1; }

worker/agent/keel-worker "${tls[@]}" --server "$KEEL_SERVER" --trainer worker/engine/keel-train --work-dir "$work/w" \
  --no-gpus --cpu-slots 1 --metrics-listen off 2> "$work/worker.log" &
pids+=($!)
for _ in $(seq 50); do
  client/keel workers "${tls[@]}" | grep -q worker- && break
  sleep 0.2
done
client/keel workers "${tls[@]}" | grep worker- || { echo "FAIL: the worker did not register over TLS"; cat "$work/worker.log"; exit 1; }
echo "PASS: TLS with client certificates for the CLI and a worker; refusals as expected"
