#!/usr/bin/env bash
# Keel's observability against real parts: promtool checks the shipped
# Prometheus config and alert rules and keeld's live /metrics; a real Prometheus
# (Debian's) scrapes a live keeld while a short CPU sweep runs (one run is
# rescued by its policy, one is stopped as diverged), and every dashboard and
# alert expression is evaluated through Prometheus's HTTP API
# (tests/observability/check.py).
set -euo pipefail
work="${TEST_TMPDIR:-/tmp}/observability"
rm -rf "$work" && mkdir -p "$work"
deploy="$PWD/deploy"
promtool check config "$deploy/prometheus/prometheus.yml"
promtool check rules "$deploy/prometheus/alerts.yml"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port); metrics_port=$(free_port); prom_port=$(free_port); worker_metrics_port=$(free_port)
export KEEL_USER_TOKENS=obs-user-token-0123456789 KEEL_WORKER_TOKEN=obs-worker-token-0123456789
export KEEL_TOKEN=$KEEL_USER_TOKENS KEEL_SERVER="127.0.0.1:$port"
server/keeld --listen "$KEEL_SERVER" --state-dir "$work/state" --metrics-listen "127.0.0.1:$metrics_port" 2> "$work/keeld.log" &
pids=($!)
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
worker/agent/keel-worker --server "$KEEL_SERVER" --trainer worker/engine/keel-train --work-dir "$work/w" --no-gpus --cpu-slots 2 \
  --metrics-listen "127.0.0.1:$worker_metrics_port" --quiet 2> "$work/worker.log" &
pids+=($!)

# The real Prometheus: the shipped rules, keeld as its target, scraped every second.
sed -e "s|127.0.0.1:9464|127.0.0.1:$metrics_port|" -e "s|127.0.0.1:9465|127.0.0.1:$worker_metrics_port|" -e 's|scrape_interval: 15s|scrape_interval: 1s|' \
  -e 's|evaluation_interval: 15s|evaluation_interval: 1s|' -e "s|- alerts.yml|- $deploy/prometheus/alerts.yml|" \
  "$deploy/prometheus/prometheus.yml" > "$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$work/prometheus.log" 2>&1 &
pids+=($!)

for _ in $(seq 100); do client/keel sweeps > /dev/null 2>&1 && break; sleep 0.1; done   # keeld is up
cat > "$work/sweep.yaml" <<'YAML'
name: observed
base:
  model: {type: proxy, layers: 1, width: 16}
  precision: mxfp8_e4m3
  batch: 32
  steps: 400
  threads: 1
  probe_every: 20
  analytics_every: 20
  optimizer: {type: adam, lr: 0.003}
  schedule: {type: constant, spike_at: 200, spike_steps: 3, spike_factor: 300}
axes:
  - grid: {policy.max_interventions: [1, 3]}
policy:
  ladder: [mxfp8_e4m3, bf16]
  snapshots: {every: 25, keep: 8}
  rules:
    - {name: spike, when: [nonfinite, loss_zscore, loss_ratio], do: [{rollback: {steps: 50}}, {switch: next}, {scale_lr: 0.01}], cooldown: 50}
    - {name: again, when: [nonfinite, loss_zscore, loss_ratio], do: [stop], cooldown: 50}
YAML
client/keel submit "$work/sweep.yaml" --watch > "$work/watch.log" 2>&1 || true   # a run ends DIVERGED: exit 1
# A run of two data-parallel ranks (cpu_slots 2): the per-rank series and the Fleet panels on them.
cat > "$work/ranks.yaml" <<'YAML'
name: ranks
base:
  model: {type: proxy, layers: 1, width: 16}
  batch: 32
  steps: 200
  threads: 1
  analytics_every: 20
resources: {cpu_slots: 2}
YAML
client/keel submit "$work/ranks.yaml" --watch > "$work/watch-ranks.log" 2>&1
client/keel runs

fetch() { /usr/bin/python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" "$1"; }
fetch "http://127.0.0.1:$metrics_port/metrics" > "$work/metrics.txt"
promtool check metrics < "$work/metrics.txt"
# The Outliers dashboard's series: per layer and role (the proxy's blocks.0.fc1 and fc2).
for name in keel_run_operand_kurtosis keel_run_operand_channel_peak_to_median keel_run_operand_ftz_ratio \
    keel_run_operand_hot_channel_overlap_ratio; do
  grep -q "^$name{.*layer=\"blocks.0.fc1\".*role=\"fwd_x\"" "$work/metrics.txt" || { echo "FAIL: no $name for blocks.0.fc1 fwd_x"; grep keel_run_operand "$work/metrics.txt"; exit 1; }
done
grep -q '^keel_run_operand_ftz_ratio{.*role="wgrad_x"' "$work/metrics.txt" || { echo "FAIL: no ftz ratio for wgrad_x"; exit 1; }
if grep -q '^keel_run_operand_kurtosis{.*role="wgrad_x"' "$work/metrics.txt"; then echo "FAIL: kurtosis exported for wgrad_x (cardinality)"; exit 1; fi
# The two-rank run's per-rank series, the exposed communication time among them.
for name in keel_run_rank_step_seconds keel_run_rank_comm_seconds keel_run_rank_comm_exposed_seconds; do
  for rank in 0 1; do
    grep -q "^$name{.*rank=\"$rank\"" "$work/metrics.txt" || { echo "FAIL: no $name for rank $rank"; grep keel_run_rank "$work/metrics.txt"; exit 1; }
  done
done
for _ in $(seq 50); do   # the worker refreshes its /metrics once a second
  fetch "http://127.0.0.1:$worker_metrics_port/metrics" > "$work/worker-metrics.txt"
  grep -q '^keel_worker_trainer_exits_total{outcome="diverged"} 1' "$work/worker-metrics.txt" &&
    grep -q '^keel_worker_trainer_exits_total{outcome="ok"} 2' "$work/worker-metrics.txt" && break
  sleep 0.2
done
promtool check metrics < "$work/worker-metrics.txt"
grep -q '^keel_worker_trainer_exits_total{outcome="ok"} 2' "$work/worker-metrics.txt" || { echo "FAIL: worker exits"; cat "$work/worker-metrics.txt"; exit 1; }
grep -q '^keel_worker_trainer_exits_total{outcome="diverged"} 1' "$work/worker-metrics.txt" || { echo "FAIL: worker diverged exit"; exit 1; }
# Let Prometheus scrape the finished state a few times (and evaluate the rules).
for _ in $(seq 50); do
  fetch "http://127.0.0.1:$prom_port/api/v1/query?query=keel_run_info" | grep -q '"run"' && break
  sleep 0.2
done
sleep 3
run=$(client/keel runs --output json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["runs"][0]["id"])')
/usr/bin/python3 tests/observability/check.py "http://127.0.0.1:$prom_port" "$deploy" "$run"
