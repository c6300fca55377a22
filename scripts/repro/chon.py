"""scripts/reproduce-chon: the CHON study's NVFP4 experiment on Keel (issue 15,
docs/reproductions/chon-nvfp4.md): a softmax-attention (llama) and a gated-linear-attention
(gla) decoder, each trained in BF16, the NVFP4 recipe, NVFP4 with the Hot-Channel Patch and CHON,
on the same tokens; then the report: final validation loss and its gap to BF16, the outlier
analytics over training, and the patch's cost. `scripts/reproduce-chon --help` gives the usage.
"""
import argparse
import glob
import json
import math
import os
import signal
import statistics
import sys
import time

from . import mx_instability
from .runs import is_finite, metric_number, read_metric_lines
from .svg import svg_figure

PROG = "scripts/reproduce-chon"

MODELS = {"sa": "llama", "gla": "gla"}
SCHEMES = ["bf16", "nvfp4_recipe", "nvfp4_hcp", "chon"]

# Model sizes: width, layers, heads of (sa, gla), context, vocab, padded vocab. "tiny" is for the
# tests (byte shards, CPU).
SIZES = {
    "124m": dict(width=768, layers=12, heads={"sa": 12, "gla": 4}, context=1024, vocab=50257, padded=50304),
    "d512L8": dict(width=512, layers=8, heads={"sa": 8, "gla": 4}, context=1024, vocab=50257, padded=50304),
    "tiny": dict(width=64, layers=3, heads={"sa": 4, "gla": 2}, context=64, vocab=256, padded=256),
}

DESCRIPTION = """\
Train the CHON reproduction's runs with keel-train (one at a time; each uses the whole GPU), then
write the report. Run it from the repository root. `run` trains and then reports; `report` only
reports on what WORK holds.

WORK/MODEL-SCHEME/ holds each run (config: WORK/base.yaml plus the --set lines of its
command.txt). A run with a DONE file is skipped; an interrupted one continues from its newest
checkpoint. --deadline-s stops the running keel-train with SIGTERM at the deadline (it finishes
its step and writes a checkpoint) and exits 143: the next call with the same WORK continues."""

EPILOG = """\
The report (OUT/summary.md, OUT/plots/*.svg, OUT/runs.json):
- per model: every scheme's tokens, final validation loss (its last evaluation), relative gap
  to BF16's, and throughput; CHON's reduction of the NVFP4 recipe's gap (the issue's target: at
  least 30% for gla);
- per model: the gaps at every evaluation of the second half of training that all its runs
  share, their means, and CHON's reduction of the recipe's mean gap (with unfinished runs, the
  report says so and gives no reduction of the final gaps);
- OUT/curves.json: every run's validation losses and its training loss every 100 steps;
- the outlier dynamics of each run from its analytics lines (analytics_every): per layer, the
  forward input's top-1 channel over the median channel, its kurtosis, the overlap of its hot
  set with the previous analytics step's and its NVFP4 flush-to-zero rate, early (the first
  fifth of training) against late (the last fifth);
- plots: validation loss, and per model the top-1/median and hot-set overlap of every layer.

Environment: KEEL_TRAIN (default dist/bin/keel-train); LD_LIBRARY_PATH gets dist/lib first when
that directory exists."""


def build_parser():
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the runs, then write the report")
    run.add_argument("--train", required=True, help="the training token shard(s) (llm.c format), data.train")
    run.add_argument("--val", required=True, help="the validation shard, data.val")
    run.add_argument("--models", default="sa,gla", help="comma-separated: sa (llama), gla (default both)")
    run.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated presets (default %(default)s)")
    run.add_argument("--size", default="d512L8", choices=sorted(SIZES), help="model size (default %(default)s)")
    run.add_argument("--tokens", type=float, default=200e6, help="tokens per run (default 200e6)")
    run.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    run.add_argument("--seq", type=int, default=0, help="tokens per sequence (default: the size's context)")
    run.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    run.add_argument("--analytics-every", type=int, default=250, help="outlier analytics period (default 250)")
    run.add_argument("--eval-every", type=int, default=500, help="validation period (default 500)")
    run.add_argument("--val-batches", type=int, default=20, help="validation batches (default 20)")
    run.add_argument("--backend", default="cuda", choices=["cuda", "cpu"])
    run.add_argument("--deadline-s", type=float, default=0, help="stop at this many seconds (0: none)")
    run.add_argument("--work", required=True, help="the runs' directories")
    run.add_argument("--out", required=True, help="the report's directory")
    rep = sub.add_parser("report", help="write the report from WORK")
    rep.add_argument("--work", required=True)
    rep.add_argument("--out", required=True)
    return p


def log(message):
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def base_yaml(args, size):
    """The settings every run shares (the model type and scheme come per run)."""
    s = SIZES[size]
    seq = args.seq or s["context"]
    steps = max(1, int(round(args.tokens / (args.batch * seq))))
    warmup = max(1, steps // 50)
    return "\n".join([
        "# The CHON reproduction's shared settings (scripts/reproduce-chon; each run adds its --set lines).",
        "name: chon",
        f"model: {{type: llama, layers: {s['layers']}, width: {s['width']}, heads: 4, context: {s['context']}, "
        f"vocab: {s['vocab']}, padded_vocab: {s['padded']}}}",
        f"data: {{train: '{args.train}', val: '{args.val}', eval_every: {args.eval_every}, "
        f"val_batches: {args.val_batches}}}",
        "precision: bf16",
        f"batch: {args.batch}",
        f"seq: {seq}",
        f"steps: {steps}",
        "seed: 1337",
        f"optimizer: {{type: adamw, lr: {args.lr}, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1, "
        "grad_clip: 1.0}",
        f"schedule: {{type: cosine, warmup_steps: {warmup}, min_lr_ratio: 0.1}}",
        f"backend: {args.backend}",
        f"checkpoint_every: {max(1, steps // 10)}",
        "keep_checkpoints: 2",
        "probe_every: 0",
        f"analytics_every: {args.analytics_every}",
        "",
    ]), steps


def run_argv(model, scheme, size):
    s = SIZES[size]
    return ["--set", f"model.type={MODELS[model]}", "--set", f"model.heads={s['heads'][model]}",
            "--set", f"precision={scheme}"]


def train(args):
    models = [m for m in args.models.split(",") if m]
    schemes = [s for s in args.schemes.split(",") if s]
    for m in models:
        if m not in MODELS:
            raise SystemExit(f"{PROG}: --models: '{m}' is not allowed (allowed: {', '.join(MODELS)})")
    keel_train = os.environ.get("KEEL_TRAIN") or "dist/bin/keel-train"
    if not (os.path.isfile(keel_train) and os.access(keel_train, os.X_OK)):
        raise SystemExit(f"{PROG}: no executable {keel_train} (build it with scripts/dist, or set KEEL_TRAIN)")
    os.makedirs(args.work, exist_ok=True)
    text, steps = base_yaml(args, args.size)
    config = os.path.join(args.work, "base.yaml")
    with open(config, "w") as f:
        f.write(text)
    log(f"{len(models) * len(schemes)} runs of {steps} steps ({args.size}, {args.tokens:.3g} tokens each) in "
        f"{args.work}")
    trainer = mx_instability.Trainer(keel_train, config, os.path.abspath(args.work), 1,
                                     mx_instability.run_environment())
    start = time.monotonic()

    def interrupt(signum, frame):
        raise mx_instability.Interrupted()

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    try:
        for m in models:
            for scheme in schemes:
                run_id = f"{m}-{scheme}"
                trainer.launch(run_id, run_argv(m, scheme, args.size))
                if not trainer.wait(start + args.deadline_s if args.deadline_s else None):
                    log(f"deadline {args.deadline_s:.0f} s: stopping {run_id} (it continues next time)")
                    trainer.stop()
                    return 143
    except mx_instability.Interrupted:
        trainer.stop()
        return 143
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return 0


# ---- The report -------------------------------------------------------------------------------


def read_run(run_dir):
    """What the report needs of one run directory."""
    lines = read_metric_lines(os.path.join(run_dir, "metrics.jsonl"))
    # A rerun of a step after a resume replaces the earlier line of that step.
    by_step = {}
    for m in lines:
        by_step[m["step"]] = m
    steps = sorted(by_step)
    ms = [by_step[s] for s in steps]
    val = [(m["step"], metric_number(m.get("val_loss"))) for m in ms if "val_loss" in m]
    tps = [metric_number(m.get("tokens_per_s")) for m in ms[len(ms) // 10:]]
    tps = [t for t in tps if is_finite(t)]
    losses = [metric_number(m.get("loss")) for m in ms[-50:]]
    losses = [x for x in losses if is_finite(x)]
    analytics = []  # (step, {linear: {role: {...}}})
    for m in ms:
        if isinstance(m.get("analytics"), dict):
            analytics.append((m["step"], m["analytics"]))
    done = os.path.exists(os.path.join(run_dir, "DONE"))
    train = [(m["step"], metric_number(m.get("loss"))) for m in ms if m["step"] % 100 == 0]
    return {
        "train_every_100": train,
        "steps": steps[-1] if steps else 0,
        "done": done,
        "val": val,
        "final_val": val[-1][1] if val else math.nan,
        "final_train": statistics.fmean(losses) if losses else math.nan,
        "tokens_per_s": statistics.median(tps) if tps else math.nan,
        "analytics": analytics,
        "scheme": ms[-1].get("scheme", "") if ms else "",
    }


def config_tokens(work):
    """Tokens per step from WORK/base.yaml (batch x seq), or 0."""
    try:
        with open(os.path.join(work, "base.yaml")) as f:
            text = f.read()
    except OSError:
        return 0
    batch = seq = 0
    for line in text.splitlines():
        if line.startswith("batch:"):
            batch = int(line.split(":")[1])
        if line.startswith("seq:"):
            seq = int(line.split(":")[1])
    return batch * seq


def fmt(x, digits=4):
    if x is None or not is_finite(x):
        return "-"
    return f"{x:.{digits}f}"


def pct(x):
    return "-" if x is None or not is_finite(x) else f"{100 * x:+.2f}%"


def pct_plain(x):
    return "-" if x is None or not is_finite(x) else f"{100 * x:.2f}%"


def gaps(runs, model):
    """{scheme: relative gap of its final validation loss to bf16's}."""
    base = runs.get((model, "bf16"), {}).get("final_val", math.nan)
    out = {}
    for (m, scheme), r in runs.items():
        if m == model and is_finite(base) and base > 0:
            out[scheme] = (r["final_val"] - base) / base
    return out


def gaps_by_evaluation(runs, model):
    """The gaps to bf16 at every evaluation step that all of the model's runs share, and their mean
    over the second half of training (steps past half the last shared one): one final evaluation
    can fall on a lucky or unlucky batch of the data's order, a run of them cannot.
    Returns (steps, {scheme: [gap per step]}, {scheme: second-half mean}, second-half steps)."""
    schemes = [s for s in SCHEMES if (model, s) in runs]
    if "bf16" not in schemes:
        return [], {}, {}, []
    vals = {s: {step: v for step, v in runs[(model, s)]["val"] if is_finite(v)} for s in schemes}
    steps = sorted(set.intersection(*(set(v) for v in vals.values())))
    per = {}
    for s in schemes:
        per[s] = [(vals[s][t] - vals["bf16"][t]) / vals["bf16"][t] if vals["bf16"][t] > 0 else math.nan
                  for t in steps]
    late = [i for i, t in enumerate(steps) if steps and t > steps[-1] / 2]
    means = {}
    for s in schemes:
        xs = [per[s][i] for i in late if is_finite(per[s][i])]
        means[s] = statistics.fmean(xs) if xs else math.nan
    return steps, per, means, [steps[i] for i in late]


def linears_of(analytics):
    """The linear layers named in a run's analytics lines, in the order they first appear."""
    linears = []
    for _, a in analytics:
        for linear in a:
            if linear not in linears:
                linears.append(linear)
    return linears


def outlier_phases(analytics, role="fwd_x"):
    """Per linear, the mean top1_over_median, kurtosis, hot_overlap and ftz_rate of `role` over the
    first and the last fifth of the analytics steps:
    {linear: {"early": (top1, kurt, overlap, ftz), "late": ...}}."""
    if not analytics:
        return {}
    n = len(analytics)
    k = max(1, n // 5)
    phases = {"early": analytics[:k], "late": analytics[-k:]}
    out = {}
    for linear in linears_of(analytics):
        row = {}
        for name, part in phases.items():
            vals = {"top1_over_median": [], "kurtosis": [], "hot_overlap": [], "ftz_rate": []}
            for _, a in part:
                r = a.get(linear, {}).get(role, {})
                for key in vals:
                    v = metric_number(r.get(key))
                    if is_finite(v):
                        vals[key].append(v)
            row[name] = tuple(statistics.fmean(v) if v else math.nan for v in vals.values())
        out[linear] = row
    return out


def write_report(work, out):
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    runs = {}
    for run_dir in sorted(glob.glob(os.path.join(work, "*-*"))):
        name = os.path.basename(run_dir)
        model, _, scheme = name.partition("-")
        if model in MODELS and os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
            runs[(model, scheme)] = read_run(run_dir)
    per_step = config_tokens(work)
    lines = ["# CHON reproduction: results", "",
             f"Work directory: `{work}`. Written by `{PROG} report`.", ""]
    summary = {}
    for model in MODELS:
        schemes = [s for s in SCHEMES if (model, s) in runs]
        if not schemes:
            continue
        g = gaps(runs, model)
        recipe_tps = runs.get((model, "nvfp4_recipe"), {}).get("tokens_per_s", math.nan)
        lines += [f"## {model} ({MODELS[model]})", "",
                  "| scheme | steps | tokens | finished | final val loss | gap to bf16 | train loss (last 50) | "
                  "tokens/s | vs nvfp4_recipe |", "|---|---|---|---|---|---|---|---|---|"]
        for s in schemes:
            r = runs[(model, s)]
            tokens = r["steps"] * per_step
            rel = r["tokens_per_s"] / recipe_tps - 1 if is_finite(recipe_tps) and recipe_tps > 0 else math.nan
            lines.append(f"| {s} | {r['steps']} | {tokens / 1e6:.1f}M | {'yes' if r['done'] else 'no'} | "
                         f"{fmt(r['final_val'])} | {pct(g.get(s))} | {fmt(r['final_train'])} | "
                         f"{r['tokens_per_s']:,.0f} | {pct(rel)} |")
        lines.append("")
        finished = all(runs[(model, s)]["done"] for s in schemes)
        if not finished:
            lines.append("**Not every run has finished**, so the final losses above are from different steps and "
                         "their gaps are not comparisons; CHON's reduction is not given. The table of evaluations "
                         "below uses only the steps every run has reached.")
            lines.append("")
        recipe_gap, chon_gap = g.get("nvfp4_recipe"), g.get("chon")
        reduction = math.nan
        if (finished and recipe_gap is not None and chon_gap is not None and is_finite(recipe_gap)
                and recipe_gap > 0):
            reduction = 1 - chon_gap / recipe_gap
            lines.append(f"CHON's gap to bf16 against the NVFP4 recipe's: {pct(chon_gap)} against {pct(recipe_gap)}, "
                         f"a reduction of **{100 * reduction:.1f}%** (the issue's target for gla: at least 30%).")
            lines.append("")
        steps, per, means, late = gaps_by_evaluation(runs, model)
        late_reduction = math.nan
        if late and len(schemes) > 1:
            others = [s for s in schemes if s != "bf16"]
            lines += [f"Gap to bf16 at each evaluation of the second half ({len(late)} evaluations every run "
                      "shares; the mean is the steadier figure):", "",
                      "| step | " + " | ".join(others) + " |", "|---" * (len(others) + 1) + "|"]
            for i, t in enumerate(steps):
                if t in late:
                    lines.append(f"| {t} | " + " | ".join(pct(per[s][i]) for s in others) + " |")
            lines.append("| **mean** | " + " | ".join(f"**{pct(means[s])}**" for s in others) + " |")
            lines.append("")
            r_mean, c_mean = means.get("nvfp4_recipe"), means.get("chon")
            if r_mean is not None and c_mean is not None and is_finite(r_mean) and r_mean > 0:
                late_reduction = 1 - c_mean / r_mean
                below = sum(1 for i, t in enumerate(steps)
                            if t in late and per["chon"][i] < per["nvfp4_recipe"][i])
                lines.append(f"Over the second half, CHON's mean gap is {pct(c_mean)} against the recipe's "
                             f"{pct(r_mean)}: a reduction of **{100 * late_reduction:.1f}%**; CHON is below the "
                             f"recipe at {below} of {len(late)} evaluations.")
                lines.append("")
        summary[model] = {"gaps": g, "chon_reduction": reduction, "finished": finished,
                          "final_val": {s: runs[(model, s)]["final_val"] for s in schemes},
                          "second_half_steps": late, "second_half_mean_gaps": means,
                          "second_half_chon_reduction": late_reduction}
        # Outlier dynamics of each run's forward inputs.
        for s in schemes:
            phases = outlier_phases(runs[(model, s)]["analytics"])
            if not phases:
                continue
            lines += [f"### {model} {s}: outliers of the forward inputs (fwd_x), early and late", "",
                      "| layer | top-1/median early | late | kurtosis early | late | hot-set overlap early | late | "
                      "NVFP4 flush-to-zero early | late |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for linear, row in phases.items():
                e, l = row["early"], row["late"]
                lines.append(f"| {linear} | {fmt(e[0], 1)} | {fmt(l[0], 1)} | {fmt(e[1], 1)} | {fmt(l[1], 1)} | "
                             f"{fmt(e[2], 2)} | {fmt(l[2], 2)} | {pct_plain(e[3])} | {pct_plain(l[3])} |")
            lines.append("")
        plot_model(out, model, {s: runs[(model, s)] for s in schemes})
        lines += [f"Plots: `plots/{model}-val.svg`, `plots/{model}-outliers.svg`.", ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, "runs.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=lambda x: None)
    # Every run's curves, small enough to carry back from a GPU machine where metrics.jsonl is not.
    curves = {f"{m}-{s}": {"val": r["val"], "train_every_100": r["train_every_100"]} for (m, s), r in runs.items()}
    with open(os.path.join(out, "curves.json"), "w") as f:
        json.dump(curves, f, sort_keys=True, default=lambda x: None)
    log(f"report: {out}/summary.md ({len(runs)} runs)")


def plot_model(out, model, runs):
    last = max([r["steps"] for r in runs.values()] + [1])
    series = [{"label": s, "x": [x for x, _ in r["val"]], "y": [y for _, y in r["val"]]} for s, r in runs.items()]
    svg_figure(os.path.join(out, "plots", f"{model}-val.svg"), [{"ylabel": "validation loss", "series": series}],
               (0, last), f"{model} ({MODELS[model]}): validation loss")
    # The bf16 run's outliers (else the first run's), per layer.
    scheme = "bf16" if "bf16" in runs else next(iter(runs))
    analytics = runs[scheme]["analytics"]
    top1, overlap = [], []
    for linear in linears_of(analytics):
        xs = [step for step, _ in analytics]
        t = [metric_number(a.get(linear, {}).get("fwd_x", {}).get("top1_over_median")) for _, a in analytics]
        o = [metric_number(a.get(linear, {}).get("fwd_x", {}).get("hot_overlap")) for _, a in analytics]
        top1.append({"label": linear, "x": xs, "y": t})
        overlap.append({"label": linear, "x": xs, "y": o})
    svg_figure(os.path.join(out, "plots", f"{model}-outliers.svg"),
               [{"ylabel": "fwd_x top-1 channel / median channel", "series": top1, "log": True},
                {"ylabel": "fwd_x hot-set overlap with the previous analytics step", "series": overlap,
                 "ylim": (0, 1)}],
               (0, last), f"{model} ({MODELS[model]}) {scheme}: outliers per layer")


def main(argv=None):
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    rc = 0
    if args.command == "run":
        rc = train(args)
    write_report(os.path.abspath(args.work), args.out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
