#!/usr/bin/env python3
"""Issue 13 on a 2-GPU host: one 2-GPU gang and two 1-GPU runs submitted together to a real keeld
with one keel-worker seeing both GPUs; prints each run's state changes with times, so that the
timeline shows whether the scheduler left a GPU idle after the gang finished.
  session25_pack.py BIN_DIR SWEEP_GPUS2 SWEEP_GPUS1 WORK_DIR"""
import json, os, subprocess, sys, time

bin_dir, sweep2, sweep1, work = sys.argv[1:5]
worker_args = sys.argv[5].split() if len(sys.argv) > 5 else []  # e.g. "--fake-gpus 2" for a dry run
state, wdir = os.path.join(work, "state"), os.path.join(work, "worker")
os.makedirs(work, exist_ok=True)
port = "7395"
env = dict(os.environ)
procs = [subprocess.Popen([os.path.join(bin_dir, "keeld"), "--listen", f"127.0.0.1:{port}", "--state-dir", state,
                           "--metrics-listen", "off"], stdout=open(os.path.join(work, "keeld.log"), "w"),
                          stderr=subprocess.STDOUT)]
for _ in range(200):
    if all(os.path.exists(os.path.join(state, t)) for t in ("user.token", "worker.token")):
        break
    time.sleep(0.1)
env["KEEL_TOKEN"] = open(os.path.join(state, "user.token")).read().strip()
env["KEEL_WORKER_TOKEN"] = open(os.path.join(state, "worker.token")).read().strip()
env["KEEL_SERVER"] = f"127.0.0.1:{port}"


def keel(*argv):
    p = subprocess.run([os.path.join(bin_dir, "keel"), "--server", f"127.0.0.1:{port}", *argv], capture_output=True,
                       text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"keel {' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


try:
    # Both sweeps are queued before the worker connects: the scheduler sees them together.
    print(keel("submit", sweep2).strip(), flush=True)
    print(keel("submit", sweep1).strip(), flush=True)
    t0 = time.time()
    procs.append(subprocess.Popen([os.path.join(bin_dir, "keel-worker"), "--server", f"127.0.0.1:{port}", "--trainer",
                                   os.path.join(bin_dir, "keel-train"), "--work-dir", wdir, "--metrics-listen", "off",
                                   "--quiet", *worker_args], stdout=open(os.path.join(work, "worker.log"), "w"),
                                  stderr=subprocess.STDOUT, env=env))
    last = {}
    while time.time() - t0 < 240:
        runs = [(r.get("sweep_id", ""), r) for r in json.loads(keel("runs", "--output", "json"))["runs"]]
        for name, r in runs:
            key = (name, r["id"])
            desc = r["state"] + (" " + json.dumps({k: v for k, v in r.items() if "rank" in k or "gpu" in k or k == "worker"})
                                 if r["state"] == "RUNNING" else "")
            if last.get(key) != desc:
                print(f"[{time.time() - t0:6.1f} s] {name} {r['id']}: {desc}", flush=True)
                last[key] = desc
        if runs and all(r["state"] in ("SUCCEEDED", "FAILED", "DIVERGED", "CANCELLED") for _, r in runs):
            break
        time.sleep(0.5)
    print(keel("runs"))
finally:
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
