"""Small synthetic keel-train outputs for the tests: metric lines in the metrics.jsonl format
(StepMetrics::ToJson: non-finite numbers as the strings "NaN", "Infinity", "-Infinity"), run
directories and a stand-in keel-train.
"""
import json
import math
import os
import stat
import sys


def encode(x):
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, float) and math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    return x


def metric_line(step, loss, grad_norm=0.5, scheme="mxfp8_e4m3", quant=None, probe=None, ln_gamma=None):
    """One metrics.jsonl line. quant: {linear: {role: saturated}}; probe: (cosine, rel_error,
    zeta, {layer: (cosine, rel_error, zeta)}); ln_gamma: {name: (mean, std)}."""
    m = {"step": step, "unix_ms": 0, "loss": encode(loss), "lr": 0.001, "scheme": scheme, "grad_norm": encode(grad_norm)}
    m["ln_gamma"] = {name: {"mean": mean, "std": std} for name, (mean, std) in (ln_gamma or {}).items()}
    m["quant"] = {lin: {role: {"saturated": v, "nan_blocks": 0} for role, v in roles.items()}
                  for lin, roles in (quant or {}).items()}
    if probe is not None:
        cosine, rel_error, zeta, layers = probe
        m["probe"] = {"cosine": cosine, "rel_error": rel_error, "zeta": zeta,
                      "layers": {k: {"cosine": c, "rel_error": r, "zeta": z} for k, (c, r, z) in layers.items()}}
    return json.dumps(m)


def loss_curve(steps, level=0.002, spikes=None):
    """Losses of steps 1..steps: a flat `level`, except {step: loss} in spikes."""
    spikes = spikes or {}
    return [spikes.get(s, level) for s in range(1, steps + 1)]


def write_run(work, run_id, losses, first_step=1, **line_args):
    """WORK/run_id/metrics.jsonl with one line per loss, steps first_step, first_step + 1, ..."""
    d = os.path.join(work, run_id)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for i, loss in enumerate(losses):
            f.write(metric_line(first_step + i, loss, **line_args) + "\n")
    return d


# A stand-in for keel-train: `presets`, or a run that writes a metric line (step, loss, grad_norm,
# scheme) per step up to --steps (default FAKE_STEPS, else 100) and a checkpoint directory
# (holding its step) every checkpoint_every steps and at the end, continuing after --resume's
# checkpoint. The loss is flat; an MX run of a seed listed in FAKE_BLOWUPS ("seed:step,...") is at
# 1.0 from that step. FAKE_SLEEP makes it wait first; SIGTERM then writes a checkpoint and exits
# 130, as keel-train does.
FAKE_TRAINER = r'''
import json, os, signal, sys, time
a = sys.argv[1:]
if a[:1] == ["presets"]:
    print("fake presets")
    sys.exit(0)
sets, opts, i = {}, {}, 0
while i < len(a):
    if a[i] == "--set":
        k, v = a[i + 1].split("=", 1); sets[k] = v; i += 2
    elif a[i] in ("--quiet", "--switch-precision"):
        opts[a[i]] = True; i += 1
    else:
        opts[a[i]] = a[i + 1]; i += 2
run_dir = opts["--run-dir"]
os.makedirs(run_dir, exist_ok=True)
ckdir = os.path.join(run_dir, "checkpoints")
def checkpoint(step, scheme):
    d = os.path.join(ckdir, "step_%08d" % step)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "state.json"), "w") as f:
        json.dump({"step": step, "scheme": scheme}, f)
def stop(*_):
    checkpoint(0, "stopped")
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
scheme, start = sets.get("precision", "mxfp8_e4m3"), 0
resume = opts.get("--resume")
if resume == "latest":
    resume = os.path.join(ckdir, sorted(os.listdir(ckdir))[-1])
if resume:
    with open(os.path.join(resume, "state.json")) as f:
        state = json.load(f)
    start = state["step"]
    if "precision" not in sets:
        scheme = state["scheme"]
blowups = dict(tuple(map(int, kv.split(":"))) for kv in os.environ.get("FAKE_BLOWUPS", "").split(",") if kv)
blow = blowups.get(int(sets["seed"])) if scheme == "mxfp8_e4m3" and "--switch-precision" not in opts else None
every = int(sets.get("checkpoint_every", "0"))
steps = int(opts.get("--steps", os.environ.get("FAKE_STEPS", "100")))
with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
    for s in range(start + 1, steps + 1):
        loss = 1.0 if blow and s >= blow else 0.002
        f.write(json.dumps({"step": s, "loss": loss, "grad_norm": 0.5, "scheme": scheme}) + "\n")
        if (every and s % every == 0) or s == steps:
            checkpoint(s, scheme)
'''


def write_fake_trainer(directory):
    """Writes the stand-in keel-train into directory; returns its path."""
    path = os.path.join(directory, "fake-keel-train")
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\n" + FAKE_TRAINER)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path
