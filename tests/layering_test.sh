#!/usr/bin/env bash
# The layering rules of docs/architecture.md, checked on the dependency lists
# Bazel computed (the genquery targets in tests/BUILD, one label per line):
#   - keeld and the CLI depend on no //kernels target other than the base
#     package //kernels/base, and on no CUDA library;
#   - keel-worker depends on neither the kernels nor the engine (//worker/engine);
#   - keel-train does depend on the kernels (so the check above can see them).
set -uo pipefail
cd tests
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# forbid FILE WHAT REGEX: no label of FILE may match REGEX.
forbid() {
  local hits
  hits=$(grep -E "$3" "$1" | grep -Ev '^//kernels/base[:/]')
  if [ -n "$hits" ]; then
    fail "$1 depends on $2:"
    echo "$hits" | sed 's/^/    /'
  else
    echo "ok: $1 has no $2"
  fi
}

# need FILE LABEL: FILE must list LABEL (so an empty or broken list cannot pass).
need() {
  if grep -qxF "$2" "$1"; then echo "ok: $1 has $2"; else fail "$1 lacks $2"; fi
}

kernels='^//kernels[:/]'
cuda='(^@local_cuda//)|cuda|cublas|nccl'

for f in keeld_deps keel_deps; do
  forbid "$f" "a //kernels target other than //kernels/base" "$kernels"
  forbid "$f" "a CUDA library" "$cuda"
  need "$f" "//kernels/base:status"
done
need keeld_deps "//worker/config:run_config"
need keeld_deps "//worker/run:step_metrics"

forbid keel_worker_deps "a //kernels target other than //kernels/base" "$kernels"
forbid keel_worker_deps "the engine" '^//worker/engine[:/]'
forbid keel_worker_deps "a CUDA library" "$cuda"

need keel_train_deps "//kernels:nn"
need keel_train_deps "//worker/config:run_config"

if [ "$failures" -ne 0 ]; then
  echo "$failures layering rule(s) broken"
  exit 1
fi
echo "layering: all rules hold"
