"""scripts/reproduce-mx-policy: part 3 of docs/reproductions/mx-instability.md, the canonical MX
proxy run under an automatic stability policy, one keel-train run per seed, all at once.
`scripts/reproduce-mx-policy --help` gives the usage.
"""
import argparse
import glob
import math
import os
import shutil
import statistics
import subprocess
import sys

from .criteria import BLOWUP_FACTOR, REF_WINDOW, SEARCH_FROM
from .runs import metric_number, read_metric_lines

PROG = "scripts/reproduce-mx-policy"
# Where the runs go: /tmp/policy/sSEED, emptied first (keel-train appends to the events.jsonl of
# an existing run directory, so a rerun would otherwise copy the events of an earlier call).
RUN_ROOT = "/tmp/policy"

DESCRIPTION = """\
Part 3 of docs/reproductions/mx-instability.md: the canonical MX proxy run under the automatic
stability policy of examples/proxy_mxfp8_e4m3_policy.yaml, one keel-train run per seed, all at
once, each into /tmp/policy/sSEED (deleted first). Run it from the repository root.

Writes into OUT_DIR, per seed: sSEED.log (keel-train's output), sSEED.events.jsonl (the run's
events, or "(no events)"), sSEED.loss_every10.csv (step, loss, scheme every 10 steps) and
sSEED.summary.txt (one line: final step and loss, mean of the last 100 steps, ref = median loss
over steps 5001-6000, the first step after 1000 with loss > 10 ref or non-finite, final scheme);
then prints every OUT_DIR/*.summary.txt. Exits 1 if a run wrote no metrics."""

EPILOG = """\
Environment: KEEL_TRAIN (default dist/bin/keel-train), POLICY_CONFIG (the run config, default
examples/proxy_mxfp8_e4m3_policy.yaml), PYTHON (the interpreter scripts/reproduce-mx-policy runs
this program with; default python3)."""


def _seed(value):
    if not value.isascii() or not value.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer >= 0")
    return int(value)


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the per-seed files go")
    p.add_argument("seeds", metavar="SEED", nargs="+", type=_seed, help="a seed to run (one run each)")
    return p


def parse_args(argv):
    args = build_parser().parse_args(argv)
    duplicates = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
    if duplicates:
        build_parser().error(f"SEED {duplicates[0]}: given twice (want each seed once: its runs share /tmp/policy/s{duplicates[0]})")
    return args


def summarize(seed, rows):
    """The summary line of a run's metric lines (rows: parsed metrics.jsonl objects, at least
    one). A step written twice (a rollback replays it) counts with its last loss."""
    loss = {r["step"]: metric_number(r.get("loss")) for r in rows}
    steps = sorted(loss)
    first, last = REF_WINDOW
    window = [loss[s] for s in steps if first <= s <= last]
    ref = statistics.median(window) if window else math.nan
    blow = next((s for s in steps if s > SEARCH_FROM and (not math.isfinite(loss[s]) or loss[s] > BLOWUP_FACTOR * ref)), None)
    tail = [loss[s] for s in steps if s > steps[-1] - 100]
    return ("seed %s: %d metric lines, final step %d, final loss %.6g, mean of last 100 steps %.6g, ref(median 5001-6000) %.6g, "
            "first step after 1000 with loss > 10 ref: %s, final scheme %s"
            % (seed, len(rows), steps[-1], loss[steps[-1]], sum(tail) / len(tail), ref, blow, rows[-1].get("scheme")))


def loss_every10_csv(rows):
    """step,loss,scheme of every line whose step is a multiple of 10, the loss as written."""
    out = ["step,loss,scheme\n"]
    for r in rows:
        if r["step"] % 10 == 0:
            out.append("%d,%s,%s\n" % (r["step"], r.get("loss"), r.get("scheme")))
    return "".join(out)


def run_seeds(keel_train, config, out_dir, seeds):
    """Starts one keel-train per seed in an empty run directory and waits for all; their output
    goes to OUT_DIR/sSEED.log."""
    procs = []
    for seed in seeds:
        shutil.rmtree(f"{RUN_ROOT}/s{seed}", ignore_errors=True)
        with open(os.path.join(out_dir, f"s{seed}.log"), "w") as log:
            procs.append(subprocess.Popen(
                [keel_train, "--config", config, "--set", f"seed={seed}", "--run-dir", f"{RUN_ROOT}/s{seed}", "--quiet"],
                stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        p.wait()


def collect(out_dir, seed):
    """Writes OUT_DIR/sSEED.{events.jsonl,summary.txt,loss_every10.csv} from the run directory.
    Returns False when the run wrote no metric lines."""
    run_dir = f"{RUN_ROOT}/s{seed}"
    events = os.path.join(run_dir, "events.jsonl")
    if os.path.isfile(events):
        shutil.copyfile(events, os.path.join(out_dir, f"s{seed}.events.jsonl"))
    else:
        with open(os.path.join(out_dir, f"s{seed}.events.jsonl"), "w") as f:
            f.write("(no events)\n")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = read_metric_lines(metrics)
    if not rows:
        line = f"seed {seed}: no metric lines in {metrics} (see {out_dir}/s{seed}.log)"
        print(line, file=sys.stderr)
        with open(os.path.join(out_dir, f"s{seed}.summary.txt"), "w") as f:
            f.write(line + "\n")
        return False
    with open(os.path.join(out_dir, f"s{seed}.summary.txt"), "w") as f:
        f.write(summarize(seed, rows) + "\n")
    with open(os.path.join(out_dir, f"s{seed}.loss_every10.csv"), "w") as f:
        f.write(loss_every10_csv(rows))
    return True


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    keel_train = os.environ.get("KEEL_TRAIN") or "dist/bin/keel-train"
    config = os.environ.get("POLICY_CONFIG") or "examples/proxy_mxfp8_e4m3_policy.yaml"
    if not (os.path.isfile(keel_train) and os.access(keel_train, os.X_OK)):
        print(f"no {keel_train} (build with scripts/dist)", file=sys.stderr)
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    run_seeds(keel_train, config, args.out_dir, args.seeds)
    ok = [collect(args.out_dir, seed) for seed in args.seeds]
    for path in sorted(glob.glob(os.path.join(args.out_dir, "*.summary.txt"))):
        with open(path) as f:
            sys.stdout.write(f.read())
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
