#!/usr/bin/env bash
# Copies the reference files refcheck.py needs into <repo>/.refs (git-ignored;
# never commit them) from local git mirrors of the upstream repositories, at
# the pinned commits of README.md.
#
#   tests/refcheck/setup_refs.sh MICROXCALING_GIT_DIR TRANSFORMERENGINE_GIT_DIR
#
# Each argument is a git directory (bare or a checkout) that holds the pinned
# commit, e.g. a clone of https://github.com/microsoft/microxcaling and of
# https://github.com/NVIDIA/TransformerEngine.
set -euo pipefail

MS_COMMIT=7bc41952de394f5cc5e782baf132e7c7542eb4e4
TE_COMMIT=d0067d0da6cb01811b8072a7d304f0e00344ce2b

if [ $# -ne 2 ]; then
  echo "usage: $0 MICROXCALING_GIT_DIR TRANSFORMERENGINE_GIT_DIR" >&2
  exit 2
fi
ms=$1
te=$2
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=$repo/.refs
mkdir -p "$out/microxcaling/mx" "$out/te"
for f in mx_ops.py elemwise_ops.py formats.py specs.py; do
  git -C "$ms" show "$MS_COMMIT:mx/$f" > "$out/microxcaling/mx/$f"
done
for f in reference_nvfp4.py reference_utils.py; do
  git -C "$te" show "$TE_COMMIT:transformer_engine/pytorch/custom_recipes/$f" > "$out/te/$f"
done
echo "reference files written under $out:"
find "$out" -type f | sort
