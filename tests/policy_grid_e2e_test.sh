#!/usr/bin/env bash
# scripts/policy-grid's language-model slice end to end on the CPU, through a real keeld and a
# real keel-worker (the path the GPU runs take): `gen --model gpt --backend cpu` writes a tiny
# sweep (a GPT of 2 layers x 64 on byte shards made here by keel-train prepare-text), `run`
# submits it with `keel submit`, follows it to the end and summarizes every run, and `report`
# pairs each policy run with its unprotected twin and the bf16 reference:
#  - 5 runs (mxfp8_e4m3 and mxfp4, each unprotected and with policy: default, and bf16), all
#    SUCCEEDED, each known to be a language model (its blow-up ratio is 1.5x);
#  - every run read shuffled batches (data.shuffle: true in the run.yaml keel-worker wrote), and
#    its summary carries the loss windows and vocabulary the paired blow-up rule needs;
#  - the report has both pairs, names bf16 as where each healthy level comes from, and judged
#    the four runs against their reference (paired) and the reference alone;
#  - the series file holds the unprotected and policy runs' rows.
set -euo pipefail
root="$PWD"
work="${TEST_TMPDIR:-/tmp}/policy_grid_e2e"
rm -rf "$work" && mkdir -p "$work/bin"
for b in server/keeld worker/agent/keel-worker client/keel worker/engine/keel-train; do
  ln -s "$root/$b" "$work/bin/"
done
cd "$work"
# Byte shards of some text (vocab 256; the GPT's 50257 covers it), under data/: keel-worker lets
# runs read only its data roots (by default the data folder of its working directory).
mkdir data
for i in 1 2 3 4 5 6 7 8; do cat "$root/README.md"; done > text.txt
"$work/bin/keel-train" prepare-text text.txt data/shard --val-fraction 0.1 > prepare.txt
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
/usr/bin/python3 "$root/scripts/policy-grid" gen --name tiny --model gpt --layers 2 --widths 64 --lrs 1e-3 \
    --seeds 1 --steps 3 --batch 2 --seq 32 --backend cpu --train "$work/data/shard_train.bin" \
    --val "$work/data/shard_val.bin" -o tiny.yaml
grep -q "backend: cpu" tiny.yaml
grep -q "shuffle: true" tiny.yaml
/usr/bin/python3 "$root/scripts/policy-grid" run --bin "$work/bin" --sweep tiny.yaml --dir "$work/grid" \
    --port "$port" --deadline-s 240 --worker-args "--no-gpus --cpu-slots 2" > run.txt 2>&1 || {
  cat run.txt; tail -20 "$work/grid/keeld.log" "$work/grid/worker.log"; exit 1; }
/usr/bin/python3 - "$work/grid/tiny-runs.jsonl" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
assert len(runs) == 5, runs
assert all(r["state"] == "SUCCEEDED" for r in runs), [(r["id"], r["state"], r["message"]) for r in runs]
assert all(r["language_model"] for r in runs), runs
assert sorted((r["format"], r["variant"]) for r in runs) == [
    ("bf16", "fp32"), ("mxfp4", "default"), ("mxfp4", "plain"), ("mxfp8_e4m3", "default"),
    ("mxfp8_e4m3", "plain")], runs
assert all(r["last_step"] == 3 and r["final_loss"] is not None for r in runs), runs
# Steps 1-3 make one window (steps 1..10) of the paired rule; the GPT's vocabulary is 50257.
assert all(len(r["loss_windows"]) == 1 and r["loss_windows"][0][0] == 10 and r["vocab"] == 50257 for r in runs), runs
PY
shuffled=$(grep -l "shuffle: true" "$work"/grid/worker/runs/*/run.yaml | wc -l)
[ "$shuffled" = 5 ] || { echo "run.yaml files with shuffle: true: $shuffled, want 5"; exit 1; }
/usr/bin/python3 "$root/scripts/policy-grid" report "$work/grid/tiny-runs.jsonl" \
    --series "$work/grid/tiny-series.csv.gz" -o report.md > report.txt
grep -q "configurations x seeds with a policy run and its unprotected twin: 2" report.md || {
  cat report.md; echo "the report does not have both pairs"; exit 1; }
[ "$(grep -c '(bf16) |' report.md)" = 2 ] || { cat report.md; echo "the healthy level is not bf16's"; exit 1; }
grep -q "language models' blow-up rule: alone 1, paired 4 runs" report.md || {
  cat report.md; echo "the report does not judge the runs against their reference"; exit 1; }
rows=$(/usr/bin/python3 -c 'import gzip, sys; print(sum(1 for _ in gzip.open(sys.argv[1], "rt")) - 1)' \
    "$work/grid/tiny-series.csv.gz")
[ "$rows" = 12 ] || { echo "series rows: $rows, want 12 (4 runs x 3 steps)"; exit 1; }
echo "policy-grid: the language-model slice ran end to end through keeld and keel-worker"
