#!/usr/bin/env bash
# deploy/k8s/ checked offline (tests/k8s/check_manifests.py), and the checker
# shown to catch what it claims to: each mutation below must be refused with
# the field it names.
set -euo pipefail
check=tests/k8s/check_manifests.py
keeld=server/keeld
worker=worker/agent/keel-worker
python3 "$check" deploy/k8s "$keeld" "$worker"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# mutate NAME 'sed expression' FILE 'expected text in the complaint'
mutate() {
  local name="$1" expr="$2" file="$3" want="$4"
  rm -rf "$tmp/$name"
  cp -r deploy/k8s "$tmp/$name"
  sed -i -e "$expr" "$tmp/$name/$file"
  if cmp -s "deploy/k8s/$file" "$tmp/$name/$file"; then
    echo "FAIL $name: the sed expression changed nothing"; exit 1
  fi
  local out
  if out="$(python3 "$check" "$tmp/$name" "$keeld" "$worker" 2>&1)"; then
    echo "FAIL $name: accepted"; echo "$out"; exit 1
  fi
  if ! grep -qF -- "$want" <<< "$out"; then
    echo "FAIL $name: refused, but without '$want':"; echo "$out"; exit 1
  fi
  echo "ok $name: $(grep -F -- "$want" <<< "$out" | head -1)"
}
mutate unknown-keeld-flag 's/--metrics-listen=0.0.0.0:9464/--metrics-port=9464/' keeld.yaml "--metrics-port is not a flag of keeld"
mutate unknown-worker-flag 's/--data-root=\/data/--data-dir=\/data/' keel-worker.yaml "--data-dir is not a flag of keel-worker"
mutate selector-mismatch 's/^        app.kubernetes.io\/name: keel-worker$/        app.kubernetes.io\/name: keel-wrk/' keel-worker.yaml "spec.selector.matchLabels"
mutate missing-secret-key 's/- key: worker.token/- key: worker-token/' keel-worker.yaml "is not in Secret keel-tokens"
mutate bad-target-port 's/targetPort: metrics/targetPort: prom/' keeld.yaml "spec.ports[].targetPort"
mutate not-headless 's/clusterIP: None/clusterIP: 10.0.0.9/' keeld.yaml "is not headless"
mutate wrong-api-version 's/^apiVersion: apps\/v1/apiVersion: apps\/v1beta1/' keel-worker.yaml "apiVersion"
mutate no-gpu 's/nvidia.com\/gpu: 8/nvidia.com\/gpu: 0/' keel-worker.yaml "nvidia.com/gpu"
mutate unmounted-volume 's/^            - name: shm$/            - name: shmem/' keel-worker.yaml "is neither a volume nor a volumeClaimTemplate"
mutate missing-claim 's/claimName: keel-data/claimName: keel-dataset/' keel-worker.yaml "no PersistentVolumeClaim named"
mutate no-scrape-job 's/job_name: keel-worker/job_name: workers/' prometheus.yaml "no job 'keel-worker'"
mutate bad-quantity 's/storage: 20Gi/storage: 20GB/' keeld.yaml "storage"
echo "k8s manifests: checked, and 12 mutations refused"
