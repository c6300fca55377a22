#!/usr/bin/env bash
# keeld's Slurm mode against a real Slurm: munged, slurmctld and slurmd
# (Debian's slurm-wlm and munge) started here in a temporary directory, one
# node (this host, 2 CPUs). keeld starts with no worker and
# --slurm-sbatch deploy/slurm/keel-worker.sbatch; a sweep of CPU runs is
# submitted; keeld must submit worker jobs (at most --slurm-max-jobs at once),
# the jobs' keel-workers must run every run to SUCCEEDED, and once idle they
# must exit by themselves, ending their jobs.
set -euo pipefail
root="$PWD"
keeld="$root/server/keeld"
keel="$root/client/keel"
script="$root/deploy/slurm/keel-worker.sbatch"
for t in munged slurmctld slurmd sbatch squeue scancel; do
  command -v "$t" > /dev/null || [ -x "/usr/sbin/$t" ] || {
    echo "FAIL: $t not found: this test needs Debian's slurm-wlm and munge (scripts/install-deps installs them)"; exit 1; }
done
export PATH="$PATH:/usr/sbin"
# Not under TEST_TMPDIR: munge's and Slurm's unix sockets need a short path (108 bytes).
D="$(mktemp -d /tmp/keel-slurm.XXXXXX)"
pids=()
cleanup() {
  set +e
  [ -n "${SLURM_CONF:-}" ] && scancel --name=keel-worker-test > /dev/null 2>&1
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null; done
  sleep 1
  for p in "${pids[@]}"; do kill -9 "$p" 2> /dev/null; done
  if [ "${keep:-0}" = 0 ]; then rm -rf "$D"; fi
}
trap cleanup EXIT
fail() { keep=1; echo "FAIL: $*"; for f in "$D"/keeld.log "$D"/log/*.log "$D"/job-*.out; do [ -f "$f" ] && { echo "== $f"; tail -30 "$f"; }; done; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1. munge, slurmctld, slurmd.
mkdir -p "$D/state" "$D/spool" "$D/log" "$D/bin" "$D/data"
dd if=/dev/urandom bs=1 count=1024 of="$D/munge.key" 2> /dev/null
chmod 400 "$D/munge.key"
munged -f -F --key-file="$D/munge.key" --socket="$D/munge.sock" --pid-file="$D/munged.pid" \
  --log-file="$D/log/munged.log" --seed-file="$D/munged.seed" > /dev/null 2>&1 &
pids+=($!)
host="$(hostname -s)"
ctld_port="$(free_port)"; slurmd_port="$(free_port)"
cat > "$D/slurm.conf" <<CONF
ClusterName=keeltest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
AuthInfo=socket=$D/munge.sock
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
for _ in $(seq 50); do [ -S "$D/munge.sock" ] && break; sleep 0.1; done
slurmctld -D -f "$SLURM_CONF" > "$D/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -f "$SLURM_CONF" -N "$host" > "$D/log/slurmd.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do sinfo --noheader -o '%T' 2> /dev/null | grep -q idle && break; sleep 0.2; done
sinfo --noheader -o '%T' | grep -q idle || fail "slurmd never became idle"
echo "ok: slurm up ($host, ctld port $ctld_port)"

# 2. The flags.
status=0; out="$("$keeld" --slurm-max-jobs 2 --state-dir "$D/x" 2>&1)" || status=$?
[ "$status" = 2 ] && grep -q "need --slurm-sbatch" <<< "$out" || fail "--slurm-max-jobs alone: exit $status: $out"
status=0; out="$("$keeld" --slurm-sbatch "$D/missing.sbatch" --state-dir "$D/x" 2>&1)" || status=$?
[ "$status" = 2 ] && grep -q "missing.sbatch' is not a readable batch script" <<< "$out" || fail "missing script: exit $status: $out"
[ ! -e "$D/x" ] || fail "a refused keeld created its state dir"
echo "ok: bad --slurm flags refused, nothing created"

# 3. keeld in Slurm mode, no worker yet.
ln -s "$root/worker/agent/keel-worker" "$D/bin/keel-worker"
ln -s "$root/worker/engine/keel-train" "$D/bin/keel-train"
port="$(free_port)"
export KEEL_SERVER="127.0.0.1:$port"
# TMPDIR reaches the jobs through sbatch (--export=ALL): their work dirs
# ($TMPDIR/keel-worker-JOBID) are this test's, even when another copy of it
# runs beside it with the same job ids.
mkdir -p "$D/tmp"
TMPDIR="$D/tmp" KEEL_BIN="$D/bin" KEEL_WORKER_CPU_SLOTS=1 KEEL_WORKER_IDLE_S=4 KEEL_DATA_ROOT="$D/data" KEEL_WORK_DIR= \
  "$keeld" --listen "$KEEL_SERVER" --state-dir "$D/keeld" --metrics-listen off \
  --slurm-sbatch "$script" --slurm-max-jobs 2 --slurm-job-name keel-worker-test \
  --slurm-sbatch-args "--cpus-per-task=1 --output=$D/job-%j.out" > "$D/keeld.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -s "$D/keeld/user.token" ] && break; sleep 0.1; done
export KEEL_TOKEN="$(cat "$D/keeld/user.token")"
cat > "$D/sweep.yaml" <<YAML
name: slurm-grow
base:
  model: {type: proxy, layers: 2, width: 32}
  batch: 64
  steps: 40
  backend: cpu
  threads: 1
  log_every: 20
axes:
  - grid: {seed: [1, 2, 3, 4]}
resources: {cpu_slots: 1}
YAML
[ "$("$keel" workers --output json | python3 -c 'import json,sys; print(len(json.load(sys.stdin).get("workers", [])))')" = 0 ] \
  || fail "keeld has workers before Slurm started any"
"$keel" submit "$D/sweep.yaml" > /dev/null
echo "ok: sweep of 4 runs submitted to a keeld without workers"

# 4. Jobs appear (never more than 2 of ours), runs finish.
max_jobs=0
for i in $(seq 600); do
  n="$(squeue --noheader --name=keel-worker-test -o '%i' | wc -l)"
  [ "$n" -gt "$max_jobs" ] && max_jobs="$n"
  done_runs="$("$keel" runs --output json | python3 -c 'import json,sys; print(sum(r["state"]=="SUCCEEDED" for r in json.load(sys.stdin)["runs"]))')"
  [ "$done_runs" = 4 ] && break
  sleep 0.25
done
[ "$done_runs" = 4 ] || fail "only $done_runs of 4 runs SUCCEEDED"
grep -q "keeld: slurm: submitted job" "$D/keeld.log" || fail "keeld never said it submitted a job"
[ "$max_jobs" -ge 1 ] && [ "$max_jobs" -le 2 ] || fail "saw $max_jobs worker jobs at once (want 1..2)"
submitted="$(grep -c "keeld: slurm: submitted job" "$D/keeld.log")"
echo "ok: 4 runs SUCCEEDED on Slurm-started workers ($submitted jobs submitted, at most $max_jobs at once)"

# 5. Idle workers exit; their jobs end.
for _ in $(seq 120); do
  [ "$(squeue --noheader --name=keel-worker-test -o '%i' | wc -l)" = 0 ] && break
  sleep 0.25
done
[ "$(squeue --noheader --name=keel-worker-test -o '%i' | wc -l)" = 0 ] || fail "worker jobs still in squeue 30 s after the sweep"
for f in "$D"/job-*.out; do
  grep -q "idle for 4 s" "$f" || fail "$(basename "$f"): its worker did not exit idle"
done
sleep 6
after="$(grep -c "keeld: slurm: submitted job" "$D/keeld.log")"
[ "$after" = "$submitted" ] || fail "keeld submitted more jobs with nothing queued ($submitted -> $after)"
echo "ok: idle workers exited, their jobs ended, and keeld submitted nothing more"
echo "PASS"
