"""scripts/reproduce-mx-instability: runs the MX-instability paper's proxy experiments
(docs/reproductions/mx-instability.md) with keel-train, then writes the report (report.py).
`scripts/reproduce-mx-instability --help` gives the usage.
"""
import argparse
import datetime
import glob
import os
import shutil
import signal
import subprocess
import sys
import time

from . import criteria
from .report import INTERVENTION_NAMES, MX, write_report
from .runs import ManifestEntry, RunStore, read_manifest

PROG = "scripts/reproduce-mx-instability"

DESCRIPTION = """\
Reproduce the MX-instability paper's proxy experiments with keel-train, and write the summary
tables, small CSVs and SVG plots that docs/reproductions/mx-instability.md shows. Run it from the
repository root.

OUT_DIR gets the small results: summary.md, *.csv, series/, probe/, plots/ (a few MB)."""

EPILOG = """\
Re-running with the same --work skips finished runs and continues interrupted ones from their
newest checkpoint (keel-train writes one on SIGTERM; SIGTERM or SIGINT to this program stops its
keel-train processes that way and exits 143). Whole set: ~10 min of one H200; to fit 600 s calls,
split it: --seeds "1337 5" (the two that diverge) and --seeds "1 2 3 4" --no-interventions.

Environment: KEEL_TRAIN (default dist/bin/keel-train), CONFIG (default
examples/proxy_mxfp8_e4m3.yaml), PYTHON (the interpreter scripts/reproduce-mx-instability runs
this program with; default python3; stdlib only). LD_LIBRARY_PATH gets dist/lib first when that
directory exists.

What it runs (all with the CUDA backend of the config, from the repository root):
1. Baselines, for every seed: mxfp8_e4m3 (probe_every 50, a checkpoint every 500 steps, all
   kept), bf16 (probe_every 50) and fp32 (no probe: it would compare fp32 with itself).
2. Blow-up criterion, per run: ref = median loss over steps 5001..6000 of the run itself
   (falling back to the same seed's fp32 ref if the run's own is over 3x that, i.e. the window
   is already polluted by a spike); blow-up = first step after step 1000 (the initial descent
   is over by step ~300) with loss > 10 ref (or a non-finite loss). Resumed runs use the ref of
   the MX baseline they resume from, and search from their first step.
3. For every MX baseline that ran all --steps and blew up at step B: C = the newest multiple of
   100 at or before B - 400 (the checkpoint a checkpoint_every=100 run would offer; none if C <
   500). The checkpoint at C is regenerated bit-exactly from the baseline's checkpoint at the
   multiple of 500 at or below C (resume in MX to step C; its losses are checked against the
   baseline's), which keeps the baseline's disk use at 18 checkpoints (100 MB each) instead of
   90. From C, to the last step: the unchanged MX continuation (control, must equal the baseline
   bit for bit) and six interventions with --switch-precision: fp32; bump_exponent; layernorm
   fp32; bf16 activations (fwd_x, wgrad_x bf16; gradients E4M3); bf16 activations and gradients
   (mx_w_e4m3_a_bf16); forward-only quantization (mxfp8_e4m3_fwd_only).
4. Report (scripts/repro/report.py): summary.md, baselines.csv, interventions.csv,
   bitexact.csv, series/ID.csv (10-step windows of loss), probe/ID.csv (every probe step: probe
   cosine, rel_error, zeta overall and per layer, saturated fraction per role, LN gamma),
   quant/ID.csv (saturated fraction per linear and role at probe steps), window/ID.csv (every
   step around the blow-up), plots/*.svg; also presets.txt, device.txt, commit.txt (before the
   runs), manifest.tsv and commands.txt (every run's keel-train command and exit status).
Every run directory WORK/ID holds command.txt, stderr.log, rc (keel-train's exit status) and
DONE once it succeeded. Every run directory is created before keel-train runs in it."""

# Tags: a name and the --set overrides that make its model/optimizer.
TAG_SETS = {
    "canon": [],
    "L6-lr1e-3": ["--set", "model.layers=6", "--set", "optimizer.lr=1e-3"],
    "L8-lr1e-3": ["--set", "model.layers=8", "--set", "optimizer.lr=1e-3"],
}
GRID_TAGS = ["L6-lr1e-3", "L8-lr1e-3"]

# The six interventions: their --set overrides (all run with --switch-precision).
INTERVENTION_SETS = {
    "fp32": ["--set", "precision=fp32"],
    "bump_exponent": ["--set", "precision.bump_exponent=true"],
    "ln_fp32": ["--set", "precision.layernorm=fp32"],
    "bf16_act": ["--set", "precision.fwd_x=bf16", "--set", "precision.wgrad_x=bf16",
                 "--set", "precision.dgrad_dy=mxfp8_e4m3", "--set", "precision.wgrad_dy=mxfp8_e4m3"],
    "bf16_act_grad": ["--set", "precision=mx_w_e4m3_a_bf16"],
    "fwd_only": ["--set", "precision=mxfp8_e4m3_fwd_only"],
}
assert list(INTERVENTION_SETS) == INTERVENTION_NAMES

# Per baseline precision: probe, checkpoints (the MX baselines keep every one: interventions
# resume from them).
BASELINE_SETS = {
    MX: ["--set", "probe_every=50", "--set", "checkpoint_every=500", "--set", "keep_checkpoints=0"],
    "bf16": ["--set", "probe_every=50", "--set", "checkpoint_every=0"],
    "fp32": ["--set", "probe_every=0", "--set", "checkpoint_every=0"],
}
RESUMED_SETS = ["--set", "probe_every=50", "--set", "checkpoint_every=0"]


# ---------------------------------------------------------------------- arguments

def positive_int(value):
    """argparse type: an integer >= 1."""
    try:
        n = int(value)
    except ValueError:
        n = None
    if n is None or n < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 1")
    return n


def seed_list(value):
    """argparse type: seeds separated by spaces, each an integer >= 0, each once."""
    seeds = []
    for word in value.split():
        if not (word.isascii() and word.isdigit()):
            raise argparse.ArgumentTypeError(
                f"{value!r}: seed {word!r} is not an integer >= 0 (want seeds separated by spaces, e.g. \"1337 1 2\")")
        seed = int(word)
        if seed in seeds:
            raise argparse.ArgumentTypeError(f"{value!r}: seed {seed} appears twice (want each seed once)")
        seeds.append(seed)
    if not seeds:
        raise argparse.ArgumentTypeError(f"{value!r}: no seed (want seeds separated by spaces, e.g. \"1337 1 2\")")
    return seeds


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", metavar="OUT_DIR", help="small results (see above)")
    p.add_argument("--work", metavar="DIR",
                   help="run directories (metrics.jsonl, checkpoints; ~2 GB per MX seed); default OUT_DIR/runs")
    p.add_argument("--seeds", metavar='"S ..."', type=seed_list, default=[1337, 1, 2, 3, 4, 5],
                   help='seeds of the canonical run (default "1337 1 2 3 4 5")')
    p.add_argument("--jobs", metavar="N", type=positive_int, default=9,
                   help="keel-train processes at once on the one GPU (default 9; on an H200 they time-slice the "
                        "GPU, so this saves little: ~26 s per 9000-step run either way)")
    p.add_argument("--steps", metavar="N", type=positive_int, default=9000,
                   help="steps of every run (default 9000, as the paper; the criterion needs more than 6000)")
    p.add_argument("--grid", action="store_true",
                   help="also the paper's grid direction: MX, bf16 and fp32 at (L6, lr 1e-3) and (L8, lr 1e-3), "
                        "seeds --grid-seeds; diverged MX runs there get the interventions too")
    p.add_argument("--grid-seeds", metavar='"S ..."', type=seed_list, default=[1337, 1],
                   help='seeds of the --grid configurations (default "1337 1")')
    p.add_argument("--no-interventions", dest="interventions", action="store_false", help="baselines only")
    p.add_argument("--analyze-only", action="store_true",
                   help="no training; (re)write OUT_DIR from what is under --work")
    p.add_argument("--clean", action="store_true", help="delete checkpoints under --work at the end")
    return p


def parse_args(argv):
    return build_parser().parse_args(argv)


# ---------------------------------------------------------------------- the runs

def log(message):
    """A progress line on stderr. One that cannot be written (stderr closed) is dropped: it must
    not stop the runs."""
    try:
        print(f"[{datetime.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)
    except OSError:
        pass


def tags(args):
    return ["canon"] + (GRID_TAGS if args.grid else [])


def seeds_of(args, tag):
    return args.seeds if tag == "canon" else args.grid_seeds


def checkpoint_path(run_dir, step):
    return os.path.join(run_dir, "checkpoints", "step_%08d" % step)


def baseline_runs(args, steps):
    """(manifest entry, keel-train arguments) of every baseline, MX first (the longest, and
    needed by the interventions)."""
    runs = []
    for prec in (MX, "bf16", "fp32"):
        for tag in tags(args):
            for seed in seeds_of(args, tag):
                entry = ManifestEntry(f"{tag}-{prec}-s{seed}", "baseline", tag, seed, prec, None)
                argv = (["--set", f"seed={seed}", "--set", f"precision={prec}"] + TAG_SETS[tag]
                        + BASELINE_SETS[prec] + ["--steps", str(steps)])
                runs.append((entry, argv))
    return runs


def regen_run(plan_entry, work):
    """(manifest entry, keel-train arguments, checkpoint at C) of the run that regenerates the
    checkpoint at C from the baseline's at P; (None, None, checkpoint) when P == C."""
    tag, seed, c, p = plan_entry.tag, plan_entry.seed, plan_entry.resume, plan_entry.source
    base_dir = os.path.join(work, f"{tag}-{MX}-s{seed}")
    if p == c:
        return None, None, checkpoint_path(base_dir, c)
    entry = ManifestEntry(f"{tag}-s{seed}-regen", "regen", tag, seed, MX, p)
    argv = (["--set", f"seed={seed}"] + TAG_SETS[tag] + RESUMED_SETS
            + ["--steps", str(c), "--resume", checkpoint_path(base_dir, p)])
    return entry, argv, checkpoint_path(os.path.join(work, entry.id), c)


def resumed_runs(plan_entry, checkpoint, steps):
    """(manifest entry, keel-train arguments) of the control and the interventions from C."""
    tag, seed, c = plan_entry.tag, plan_entry.seed, plan_entry.resume
    common = (["--set", f"seed={seed}"] + TAG_SETS[tag] + RESUMED_SETS
              + ["--steps", str(steps), "--resume", checkpoint])
    runs = [(ManifestEntry(f"{tag}-s{seed}-control", "control", tag, seed, "control", c), common)]
    for name in INTERVENTION_NAMES:
        runs.append((ManifestEntry(f"{tag}-s{seed}-iv-{name}", "iv", tag, seed, name, c),
                     common + INTERVENTION_SETS[name] + ["--switch-precision"]))
    return runs


class Interrupted(Exception):
    """SIGTERM or SIGINT arrived."""


class Trainer:
    """Runs keel-train into WORK/ID run directories, at most `jobs` at once."""

    POLL_SECONDS = 0.2

    def __init__(self, keel_train, config, work, jobs, env):
        self.keel_train = keel_train
        self.config = config
        self.work = work
        self.jobs = jobs
        self.env = env
        self.running = []  # (run id, run dir, Popen, start time)

    def command(self, run_dir, argv, resume_latest):
        return ([self.keel_train, "--config", self.config, "--run-dir", run_dir, "--quiet"] + argv
                + (["--resume", "latest"] if resume_latest else []))

    def command_line(self, run_dir, argv, resume_latest):
        """The line command.txt records: the command, and before "--resume latest" (or, for a
        fresh start, at the end) one space, as the shell version of this program wrote it, so that
        a work directory continued by either reads alike."""
        base = " ".join(self.command(run_dir, argv, False))
        return base + " " + ("--resume latest" if resume_latest else "")

    def launch(self, run_id, argv):
        """Starts keel-train for WORK/run_id, once fewer than `jobs` run. A run with a DONE file is
        skipped; one with checkpoints (it was interrupted) continues from its newest; any other
        starts in a new, empty run directory."""
        while len(self.running) >= self.jobs:
            self._reap_one()
        run_dir = os.path.join(self.work, run_id)
        if os.path.exists(os.path.join(run_dir, "DONE")):
            return
        interrupted = bool(glob.glob(os.path.join(run_dir, "checkpoints", "step_*")))
        if interrupted:
            log(f"{run_id}: continuing from its newest checkpoint")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
            os.makedirs(run_dir)
        cmd = self.command(run_dir, argv, interrupted)
        with open(os.path.join(run_dir, "command.txt"), "a") as f:
            f.write(self.command_line(run_dir, argv, interrupted) + "\n")
        with open(os.path.join(run_dir, "stderr.log"), "ab") as err:
            proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=self.env)
        self.running.append((run_id, run_dir, proc, time.monotonic()))

    def _finish(self, job, rc):
        run_id, run_dir, _, start = job
        if rc < 0:
            rc = 128 - rc  # killed by signal -rc: the status a shell reports (139 for SIGSEGV)
        with open(os.path.join(run_dir, "rc"), "w") as f:
            f.write(f"{rc}\n")
        if rc == 0:
            open(os.path.join(run_dir, "DONE"), "w").close()
        log(f"{run_id}: rc {rc}, {int(time.monotonic() - start)} s")

    def _reap_one(self, deadline=None):
        """Waits for one run to end; False (none ended) once time.monotonic() passes deadline."""
        while True:
            for job in self.running:
                rc = job[2].poll()
                if rc is not None:
                    self.running.remove(job)
                    self._finish(job, rc)
                    return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(self.POLL_SECONDS)

    def wait(self, deadline=None):
        """Waits for every started run: True when they all ended, False when time.monotonic()
        passed `deadline` first (they keep running)."""
        while self.running:
            if not self._reap_one(deadline):
                return False
        return True

    def stop(self):
        """SIGTERM to every running keel-train (each finishes its step and writes a checkpoint),
        and waits for them; their run directories get no rc and no DONE."""
        for run_id, _, proc, _ in self.running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for run_id, _, proc, _ in self.running:
            proc.wait()
            log(f"{run_id}: stopped; it continues from its checkpoint next time")
        self.running = []


def append_manifest(path, entry):
    with open(path, "a") as f:
        f.write(entry.line())


def _write_output(path, cmd, env, fallback, keep_failed_output):
    """Writes the output of cmd to path, and `fallback` when it cannot run or fails: after its
    output if keep_failed_output (what a failing nvidia-smi says about the driver is worth
    keeping), instead of it otherwise."""
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        if out.returncode == 0:
            text = out.stdout
        else:
            text = (out.stdout if keep_failed_output else "") + fallback
    except OSError:
        text = fallback
    with open(path, "w") as f:
        f.write(text)


def record_setup(trainer, out_dir, env):
    """presets.txt, device.txt and commit.txt in OUT_DIR. Fails if keel-train presets fails."""
    with open(os.path.join(out_dir, "presets.txt"), "w") as f:
        subprocess.run([trainer.keel_train, "presets"], stdout=f, env=env, check=True)
    _write_output(os.path.join(out_dir, "device.txt"),
                  ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], env,
                  "no nvidia-smi\n", keep_failed_output=True)
    _write_output(os.path.join(out_dir, "commit.txt"), ["git", "rev-parse", "HEAD"], env, "unknown\n",
                  keep_failed_output=False)


def train(args, trainer, work, manifest):
    """Steps 1-3: the baselines, then the regenerated checkpoints, control and interventions."""
    for entry, argv in baseline_runs(args, args.steps):
        append_manifest(manifest, entry)
        trainer.launch(entry.id, argv)
    trainer.wait()
    if not args.interventions:
        return
    # The plan needs losses only: the quant and probe objects of the lines are not parsed.
    plan = criteria.checkpoint_plan(read_manifest(manifest), RunStore(work, full=False), args.steps, MX)
    log("diverged MX baselines (tag seed blow-up C P): " + (" ".join(p.line() for p in plan) or "none"))
    checkpoints = {}
    for p in plan:
        entry, argv, checkpoint = regen_run(p, work)
        checkpoints[(p.tag, p.seed)] = checkpoint
        if entry:
            append_manifest(manifest, entry)
            trainer.launch(entry.id, argv)
    trainer.wait()
    for p in plan:
        checkpoint = checkpoints[(p.tag, p.seed)]
        if not os.path.isdir(checkpoint):
            log(f"missing checkpoint {checkpoint}; skipping {p.tag} seed {p.seed}")
            continue
        for entry, argv in resumed_runs(p, checkpoint, args.steps):
            append_manifest(manifest, entry)
            trainer.launch(entry.id, argv)
    trainer.wait()


def write_commands(work, out_dir):
    """OUT_DIR/commands.txt: per run directory, its id, exit status ('?' while unknown) and
    keel-train command(s)."""
    lines = []
    for d in sorted(glob.glob(os.path.join(work, "*", ""))):
        run_dir = d.rstrip("/")
        cmd_path = os.path.join(run_dir, "command.txt")
        if not os.path.isfile(cmd_path):
            continue
        rc_path = os.path.join(run_dir, "rc")
        rc = open(rc_path).read().rstrip("\n") if os.path.isfile(rc_path) else "?"
        cmd = open(cmd_path).read().rstrip("\n")
        lines.append(f"{os.path.basename(run_dir)} rc={rc}: {cmd}\n")
    with open(os.path.join(out_dir, "commands.txt"), "w") as f:
        f.writelines(lines)


def run_environment():
    env = dict(os.environ)
    if os.path.isdir("dist/lib"):
        lib = os.path.join(os.getcwd(), "dist/lib")
        env["LD_LIBRARY_PATH"] = lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def _interrupt(signum, frame):
    raise Interrupted()


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    keel_train = os.environ.get("KEEL_TRAIN") or "dist/bin/keel-train"
    config = os.environ.get("CONFIG") or "examples/proxy_mxfp8_e4m3.yaml"
    work = args.work or os.path.join(args.out_dir, "runs")
    os.makedirs(args.out_dir, exist_ok=True)
    os.makedirs(work, exist_ok=True)
    out_dir, work = os.path.abspath(args.out_dir), os.path.abspath(work)
    manifest = os.path.join(work, "manifest.tsv")
    env = run_environment()

    if not args.analyze_only:
        if not (os.path.isfile(keel_train) and os.access(keel_train, os.X_OK)):
            print(f"no {keel_train} (build with scripts/dist)", file=sys.stderr)
            return 1
        seeds = " ".join(str(s) for s in args.seeds)
        log(f"keel-train {keel_train}, config {config}, work {work}, out {out_dir}, seeds {seeds}, jobs {args.jobs}")
        trainer = Trainer(keel_train, config, work, args.jobs, env)
        signal.signal(signal.SIGTERM, _interrupt)
        signal.signal(signal.SIGINT, _interrupt)
        try:
            record_setup(trainer, out_dir, env)
            train(args, trainer, work, manifest)
        except Interrupted:
            trainer.stop()
            return 143
        except subprocess.CalledProcessError as e:
            print(f"{' '.join(e.cmd)}: exit status {e.returncode}", file=sys.stderr)
            return 1
        except BaseException:
            trainer.stop()  # no keel-train left running behind a crash
            raise
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)

    write_report(work, out_dir, args.steps)
    if os.path.exists(manifest):
        shutil.copyfile(manifest, os.path.join(out_dir, "manifest.tsv"))
    write_commands(work, out_dir)
    if args.clean:
        for checkpoints in glob.glob(os.path.join(work, "*", "checkpoints")):
            shutil.rmtree(checkpoints)
    log(f"done: {out_dir}/summary.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
