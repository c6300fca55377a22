#!/usr/bin/env bash
# policy: default on a real keel-train process (CPU proxy), the way a user puts
# it on a run: an MXFP4 run whose learning rate spikes 300x for 3 steps at step
# 150 (schedule.spike_*, fault injection). The spike is tied to the step number,
# so every rollback replays into it: the run diverges again after its first
# rescue, and the policy must escalate instead of replaying:
#  - the first firing rolls back and moves mxfp4 -> mxfp6_e2m3;
#  - each later firing, before the run passes the step where the rule last fired,
#    is an `escalate` event naming that step, then one rung up, through every
#    rung of the derived ladder to fp32 (each once), then scale_lr 0.5 three times
#    (the preset's lr_fallbacks), then stop;
#  - keel-train exits 3 (diverged), with a bounded number of steps taken;
#  - refusals (exit 2): an unknown policy, probation.after 0, a rollback alone.
set -euo pipefail
train="$PWD/worker/engine/keel-train"
work="${TEST_TMPDIR:-/tmp}/policy_e2e"
rm -rf "$work" && mkdir -p "$work" && cd "$work"
cat > run.yaml <<'YAML'
name: default-policy
model: {type: proxy, layers: 2, width: 64}
precision: mxfp4
batch: 256
steps: 300
seed: 1
threads: 1
operand_stats: false
optimizer: {type: adam, lr: 0.003}
schedule: {type: constant, spike_at: 150, spike_steps: 3, spike_factor: 300}
policy: default
YAML

# 1. The escalation, end to end.
status=0
"$train" --config run.yaml --run-dir run --quiet 2> run.log || status=$?
[ "$status" = 3 ] || { echo "keel-train exited $status, want 3 (diverged)"; cat run.log; exit 1; }
grep -q "stopped the run as diverged at step" run.log || { echo "no diverged line"; cat run.log; exit 1; }
/usr/bin/python3 - run/events.jsonl <<'PY'
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
for e in events:
    print(e["step"], e["kind"], e["message"][:160])
kinds = [e["kind"] for e in events]
switches = [(e["details"]["from"], e["details"]["precision"]) for e in events if e["kind"] == "switch_precision"]
ladder = ["mxfp4", "mxfp6_e2m3", "mxfp8_e4m3", "mx_w_e4m3_a_bf16", "bf16", "fp32"]
# Every rung once, in order: no scheme was replayed.
assert switches == list(zip(ladder, ladder[1:])), switches
escalations = [e for e in events if e["kind"] == "escalate"]
# The first rescue is the rule as written; each later firing escalates: 4 more
# rungs, the three learning-rate fallbacks, the stop.
assert len(escalations) == 8, [e["message"] for e in escalations]
for e in escalations:
    assert e["details"]["rule"] == "blow-up", e
    assert "fired again at step" in e["message"], e["message"]
    assert "where it last fired" in e["message"], e["message"]
for e, rung in zip(escalations, ladder[2:]):
    assert "escalating to " + rung + " instead of replaying" in e["message"], (rung, e["message"])
    assert e["details"]["actions"].endswith(rung), e["details"]
for i in range(3):
    assert "scaling the learning rate by 0.5 (fallback %d of 3)" % (i + 1) in escalations[4 + i]["message"], \
        escalations[4 + i]["message"]
assert "the learning-rate fallback is spent, stopping the run as diverged" in escalations[7]["message"]
assert kinds.count("scale_lr") == 3 and kinds[-1] == "stop", kinds
# Every rollback went back before the spike and kept the scheme it rescued from.
rollbacks = [e for e in events if e["kind"] == "rollback"]
assert len(rollbacks) == 8, len(rollbacks)
for e, scheme in zip(rollbacks, ladder):
    assert int(e["details"]["to_step"]) < 150 <= int(e["details"]["from_step"]), e["details"]
    assert e["details"]["precision"] == scheme, (scheme, e["details"])
for e in rollbacks[len(ladder):]:  # the fallbacks' rollbacks, in fp32
    assert int(e["details"]["to_step"]) < 150 <= int(e["details"]["from_step"]), e["details"]
    assert e["details"]["precision"] == "fp32", e["details"]
print("escalated through %d rungs, then the LR, then stopped" % len(switches))
PY
# The metrics end where the run stopped, one line per step.
last=$(tail -n 1 run/metrics.jsonl | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
[ "$(wc -l < run/metrics.jsonl)" = "$last" ] || { echo "metrics.jsonl has $(wc -l < run/metrics.jsonl) lines up to step $last"; exit 1; }
[ "$last" -lt 160 ] || { echo "stopped at step $last, want right after the spike"; exit 1; }

# 2. Bad input: exit 2, naming the field, the value and what is allowed.
refused() {  # refused WHAT EXPECTED_TEXT --set ...
  local what="$1" want="$2"
  shift 2
  local rc=0
  "$train" --config run.yaml --run-dir refused --quiet "$@" 2> refused.log || rc=$?
  [ "$rc" = 2 ] || { echo "$what: exit $rc, want 2"; cat refused.log; exit 1; }
  grep -qF "$want" refused.log || { echo "$what: want '$want' in:"; cat refused.log; exit 1; }
}
refused "unknown policy" "policy: unknown policy 'safest' (allowed: default" --set policy=safest
cat > probation.yaml <<'YAML'
model: {type: proxy, layers: 2, width: 64}
policy: {preset: default, probation: {after: 0}}
YAML
rc=0; "$train" --config probation.yaml --quiet 2> refused.log || rc=$?
[ "$rc" = 2 ] && grep -qF "policy.probation.after: 0 is out of range (allowed: 1 .. " refused.log ||
  { echo "probation.after 0: exit $rc"; cat refused.log; exit 1; }
cat > replay.yaml <<'YAML'
model: {type: proxy, layers: 2, width: 64}
policy:
  rules:
    - {when: nonfinite, do: [{rollback: 10}]}
YAML
rc=0; "$train" --config replay.yaml --quiet 2> refused.log || rc=$?
[ "$rc" = 2 ] && grep -qF "policy.rules[0].do: [rollback] is a rollback alone" refused.log ||
  { echo "rollback alone: exit $rc"; cat refused.log; exit 1; }

# 3. Without --quiet, keel-train says what the policy resolved to before it trains.
"$train" --config run.yaml --run-dir says --steps 2 2> says.log
grep -qF "keel-train: policy default: ladder mxfp4 -> mxfp6_e2m3 -> mxfp8_e4m3 -> mx_w_e4m3_a_bf16 -> bf16 -> fp32; rules blow-up, drift" says.log \
  || { echo "no policy line"; cat says.log; exit 1; }
grep -qE "; snapshots every 1 steps in memory \(12 kept, [0-9]+ MiB each\)$" says.log \
  || { echo "no snapshot placement"; cat says.log; exit 1; }

# 4. keel-train presets --policies lists the default policy and its ladders.
"$train" presets --policies > policies.txt
grep -q "^default" policies.txt
grep -q "snapshots every 100 (12 kept; in host memory when they fit policy.snapshots.memory_mib,$" policies.txt
grep -q "by default an eighth of the host.s memory, at most 16384; else on disk); after each switch$" policies.txt
grep -q "rule drift: when loss_drift (the median of 250 steps > 2x its lowest, after 500 steps)" policies.txt
grep -q "mxfp4 *mxfp4 -> mxfp6_e2m3 -> mxfp8_e4m3 -> mx_w_e4m3_a_bf16 -> bf16 -> fp32" policies.txt
grep -q "rule bias, where the ladder's first rung moves the head to BF16: when grad_bias" policies.txt
grep -q "(|zeta| > 0.1 on 3 probes in a row; probe_every 100 and probe_reference bf16$" policies.txt
grep -q "^ *unless the run sets them) do$" policies.txt
grep -q "language model *mxfp4 -> mxfp4+bf16_head -> mxfp6_e2m3+bf16_head -> mxfp8_e4m3+bf16_head -> mx_w_e4m3_a_bf16+bf16_head -> bf16 -> fp32" policies.txt
rc=0; "$train" presets --bogus 2> refused.log || rc=$?
[ "$rc" = 2 ] && grep -qF "presets: unknown argument '--bogus' (allowed: --policies)" refused.log
echo PASS
