"""The report of scripts/reproduce-mx-instability: from the runs of a work directory (named by its
manifest.tsv), writes into OUT summary.md, baselines.csv, interventions.csv, bitexact.csv,
series/ID.csv, probe/ID.csv, quant/ID.csv, window/ID.csv and plots/*.svg.
"""
import csv
import math
import os

from . import criteria
from .criteria import count_over, mean_last, windows
from .runs import ROLES, RunStore, is_finite, read_manifest
from .svg import COLORS, svg_figure

MX = "mxfp8_e4m3"
BASELINE_PRECISIONS = (MX, "bf16", "fp32")
# The interventions, in the order of the tables and plots (scripts/repro/mx_instability.py runs
# them).
INTERVENTION_NAMES = ["fp32", "bump_exponent", "ln_fp32", "bf16_act", "bf16_act_grad", "fwd_only"]
SERIES_COLUMNS = ["step", "mean", "min", "max", "loss", "gnorm"]
SUBDIRS = ("series", "probe", "quant", "window", "plots")

CRITERION = ("Blow-up criterion: ref = median loss over steps 5001..6000 of the run itself (the same seed's "
             "fp32 ref if the run's own is over 3x that); blow-up = first step after step 1000 (the initial descent is "
             "over by step ~300) with loss > 10 ref or non-finite. Resumed runs: the ref of their MX baseline, "
             "searched from the resume step. 'steps>10ref' counts every step above the threshold.")


def fmt(x, digits=4):
    """A table cell: '-' for None, floats to `digits` significant digits, 'nan'/'inf' as such."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if not math.isfinite(x):
            return str(x)
        return f"{x:.{digits}g}"
    return str(x)


def csv_cell(v):
    if v is None:
        return ""
    return f"{v:.6g}" if isinstance(v, float) else v


def write_csv(path, rows, columns=None):
    """Writes dict rows as CSV (floats to 6 significant digits, None empty); columns default to
    every key in first-seen order. Writes nothing for no rows."""
    if not rows:
        return
    if columns is None:
        columns = []
        for row in rows:
            for k in row:
                if k not in columns:
                    columns.append(k)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for row in rows:
            w.writerow([csv_cell(row.get(c)) for c in columns])


def _precision_order(prec):
    return BASELINE_PRECISIONS.index(prec) if prec in BASELINE_PRECISIONS else 9


def seed_order(seeds):
    """Seed 1337 (the paper's) first, then the others ascending."""
    return sorted(seeds, key=lambda v: (v != 1337, v))


def rolling_mean(ys, n):
    """Mean of the finite values among the last n (None where there is none)."""
    out = []
    for i in range(len(ys)):
        w = [y for y in ys[max(0, i - n + 1):i + 1] if is_finite(y)]
        out.append(sum(w) / len(w) if w else None)
    return out


class Report:
    """The analysis of one work directory; write() produces every file."""

    def __init__(self, work, out, steps):
        self.out = out
        self.steps = steps
        self.store = RunStore(work, full=True)
        self.entries = read_manifest(os.path.join(work, "manifest.tsv"))
        self.refs = criteria.reference_losses(self.entries, self.store)
        self.base = {(x.tag, x.seed, x.prec): x for x in self.entries if x.kind == "baseline"}
        self.resumed = [x for x in self.entries if x.kind in ("iv", "control", "regen")]
        self.mx_baselines = [x for x in self.entries if x.kind == "baseline" and x.prec == MX]
        # Per baseline id with metrics: (ref used, blow-up step or None); baselines() fills it.
        self.blow = {}

    def load(self, entry):
        return self.store.load(entry.id)

    def _path(self, *parts):
        return os.path.join(self.out, *parts)

    def _complete_final_loss(self, entry):
        """The final loss of a baseline that ran all the steps, else None."""
        if not entry:
            return None
        r = self.load(entry)
        return r.loss[-1] if r.steps and r.steps[-1] == self.steps else None

    # ---------------------------------------------------------------- tables

    def baselines(self):
        """Markdown lines of the baselines table; writes baselines.csv and the per-run CSVs."""
        md = ["## Baselines", "",
              "| config | seed | precision | steps | ref (median 5001-6000) | blow-up | blow-up (fp32 ref) | first loss > 0.1 | steps>10ref | final loss | mean last 100 | min loss (step) | max loss after step 1000 (step) | final / fp32 final |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        rows = []
        order = sorted((x for x in self.entries if x.kind == "baseline"),
                       key=lambda x: (x.tag != "canon", x.tag, _precision_order(x.prec), x.seed))
        for x in order:
            r = self.load(x)
            if not r.steps:
                continue
            ref = self.refs[(x.tag, x.seed, x.prec)]
            settle, b = criteria.blowup(r, ref.used)
            _, b_fp = criteria.blowup(r, ref.fp32) if ref.fp32 else (None, None)
            over_0p1 = next((s for s, l in zip(r.steps, r.loss) if s > settle and (not is_finite(l) or l > 0.1)), None)
            self.blow[x.id] = (ref.used, b)
            fp_final = self._complete_final_loss(self.base.get((x.tag, x.seed, "fp32")))
            lo = criteria.min_loss(r)
            hi = criteria.max_loss(r, after=settle)
            row = dict(config=x.tag, seed=x.seed, precision=x.prec, steps=r.steps[-1], ref=ref.used, ref_source=ref.source,
                       settle=settle, blowup=b, blowup_fp32ref=b_fp, first_over_0p1=over_0p1,
                       steps_over_10ref=count_over(r, ref.used, settle) if ref.used else None,
                       final=r.loss[-1], mean_last100=mean_last(r), min=lo[1], min_step=lo[0], max=hi[1], max_step=hi[0],
                       final_over_fp32=(r.loss[-1] / fp_final) if fp_final else None)
            rows.append(row)
            md.append(f"| {x.tag} | {x.seed} | {x.prec} | {r.steps[-1]} | {fmt(ref.used)}{'' if ref.source == 'own' else ' (fp32)'} | "
                      f"{fmt(b) if b else 'none'} | {fmt(b_fp) if b_fp else 'none'} | {over_0p1 or 'none'} | {row['steps_over_10ref']} | "
                      f"{fmt(row['final'])} | {fmt(row['mean_last100'])} | {fmt(lo[1])} ({lo[0]}) | {fmt(hi[1])} ({hi[0]}) | "
                      f"{fmt(row['final_over_fp32'], 3)} |")
            write_csv(self._path("series", x.id + ".csv"), windows(r), SERIES_COLUMNS)
            if r.probes:
                write_csv(self._path("probe", x.id + ".csv"), r.probes)
                if any(len(q) > 1 for q in r.probe_quant):
                    write_csv(self._path("quant", x.id + ".csv"), r.probe_quant)
        write_csv(self._path("baselines.csv"), rows)
        md.append("")
        return md

    def interventions(self):
        """Markdown lines of the interventions table; writes interventions.csv and the runs' CSVs."""
        md = []
        if self.resumed:
            md += ["## Interventions (resumed from checkpoint C, to the last step)", "",
                   "| config | seed | run | C | MX blow-up B (B-C) | blow-up | delay vs B | steps>10ref | max loss after C (step) | final loss | mean last 100 | final / fp32 final | mean last 100 / fp32's |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        rows = []
        order = sorted((x for x in self.resumed if x.kind != "regen"),
                       key=lambda x: (x.tag != "canon", x.tag, x.seed, x.kind != "control"))
        for x in order:
            r = self.load(x)
            if not r.steps:
                continue
            mx_base = self.base[(x.tag, x.seed, MX)]
            ref, bb = self.blow.get(mx_base.id, (None, None))
            _, b = criteria.blowup(r, ref, start_step=x.resume)
            fp = self.base.get((x.tag, x.seed, "fp32"))
            fp_final = self._complete_final_loss(fp)
            fp_mean = mean_last(self.load(fp)) if fp_final else None
            hi = criteria.max_loss(r)
            row = dict(config=x.tag, seed=x.seed, run=x.prec, resume=x.resume, mx_blowup=bb, first_step=r.steps[0], last_step=r.steps[-1],
                       blowup=b, delay=(b - bb) if (b and bb) else None, steps_over_10ref=count_over(r, ref), max=hi[1], max_step=hi[0],
                       final=r.loss[-1], mean_last100=mean_last(r), final_over_fp32=(r.loss[-1] / fp_final) if fp_final else None,
                       mean_last100_over_fp32=(mean_last(r) / fp_mean) if fp_mean else None)
            rows.append(row)
            if row["delay"] is None:
                delay = "-"
            else:
                delay = ("+" if row["delay"] > 0 else "") + str(row["delay"])
            md.append(f"| {x.tag} | {x.seed} | {x.prec} | {x.resume} | {bb} ({bb - x.resume if bb else '-'}) | {b if b else 'none'} | {delay} | "
                      f"{row['steps_over_10ref']} | {fmt(hi[1])} ({hi[0]}) | {fmt(row['final'])} | {fmt(row['mean_last100'])} | "
                      f"{fmt(row['final_over_fp32'], 3)} | {fmt(row['mean_last100_over_fp32'], 3)} |")
            write_csv(self._path("series", x.id + ".csv"), windows(r), SERIES_COLUMNS)
            if r.probes:
                write_csv(self._path("probe", x.id + ".csv"), r.probes)
        write_csv(self._path("interventions.csv"), rows)
        return md

    def bitexact(self):
        """Markdown lines of the bit-exactness table of the resumed MX runs (control, regen) against
        their baseline; writes bitexact.csv."""
        rows = []
        for x in self.resumed:
            if x.kind not in ("control", "regen"):
                continue
            r = self.load(x)
            if not r.steps:
                continue
            baseline = self.load(self.base[(x.tag, x.seed, MX)])
            first, last = x.resume + 1, r.steps[-1]
            compared, identical, mismatch, expected = criteria.exact_compare(r, baseline, first, last)
            rows.append(dict(config=x.tag, seed=x.seed, run=x.kind, first=first, last=last, steps_expected=expected,
                             steps_compared=compared, identical=identical, first_mismatch=mismatch))
        write_csv(self._path("bitexact.csv"), rows)
        if not rows:
            return []
        md = ["", "## Bit-exactness of resumed MX runs against the uninterrupted baseline ((loss, grad_norm) per step, as written in metrics.jsonl)", "",
              "| config | seed | run | steps | compared | identical | first mismatch |", "|---|---|---|---|---|---|---|"]
        for b in rows:
            md.append(f"| {b['config']} | {b['seed']} | {b['run']} | {b['first']}..{b['last']} | {b['steps_compared']} | {b['identical']} | {b['first_mismatch'] or 'none'} |")
        return md

    def probes_around_blowups(self):
        """Markdown lines of the probe rows from 1000 steps before to 300 after each MX blow-up;
        writes window/ID.csv (every step from 600 before to 100 after)."""
        md = ["", "## Probe before and after the blow-up (MX baseline; probe every 50 steps)", ""]
        for x in self.mx_baselines:
            r = self.load(x)
            _, b = self.blow.get(x.id, (None, None))
            if not b:
                continue
            md += [f"### {x.tag} seed {x.seed}: blow-up at step {b}", "",
                   "| step | loss | cosine | rel_error | zeta | zeta per layer | sat max | sat mean (fwd_x, fwd_w, dgrad_dy, dgrad_w, wgrad_dy, wgrad_x) | LN gamma mean per layer |",
                   "|---|---|---|---|---|---|---|---|---|"]
            for p in r.probes:
                if b - 1000 <= p["step"] <= b + 300:
                    zeta_layers = ", ".join(fmt(p.get(f"L{i}_zeta"), 3) for i in range(16) if f"L{i}_zeta" in p)
                    sat_roles = ", ".join(fmt(p.get(f"sat_{ro}"), 2) for ro in ROLES)
                    gammas = ", ".join(fmt(p.get(f"gamma{i}_mean"), 4) for i in range(16) if f"gamma{i}_mean" in p)
                    md.append(f"| {p['step']} | {fmt(p['loss'])} | {fmt(p.get('cosine'), 3)} | {fmt(p.get('rel_error'), 3)} | {fmt(p.get('zeta'), 3)} | "
                              f"{zeta_layers} | {fmt(p.get('sat_max'), 3)} | {sat_roles} | {gammas} |")
            md.append("")
            rows = []
            for i, s in enumerate(r.steps):
                if b - 600 <= s <= b + 100:
                    row = dict(step=s, loss=r.loss[i], grad_norm=r.grad_norm[i], sat_max=r.sat_max[i])
                    for ro in ROLES:
                        row[f"sat_{ro}"] = r.sat_role[i][ro]
                    rows.append(row)
            write_csv(self._path("window", x.id + ".csv"), rows)
        return md

    # ---------------------------------------------------------------- plots

    def _blowup_of(self, entry):
        return self.blow.get(entry.id, (None, None))[1]

    def _windowed(self, entry, label, color, dash=None, width=1.2, n=10):
        w = windows(self.load(entry), n)
        return dict(label=label, x=[v["step"] for v in w], y=[v["mean"] for v in w], color=color, dash=dash, width=width)

    def _probe_series(self, entry, key, label, color, dash=None):
        ps = self.load(entry).probes
        return dict(label=label, x=[p["step"] for p in ps], y=[p.get(key) for p in ps], color=color, dash=dash)

    def _rolled(self, entry, key, n):
        ps = self.load(entry).probes
        return [p["step"] for p in ps], rolling_mean([p.get(key) for p in ps], n)

    def plot_tag(self, tag):
        """plots/TAG_loss_all_seeds.svg, TAG_probe_all_seeds.svg and TAG_onset.svg."""
        seeds = seed_order({x.seed for x in self.entries if x.tag == tag})
        panels = []
        for prec in BASELINE_PRECISIONS:
            series = []
            for i, sd in enumerate(seeds):
                x = self.base.get((tag, sd, prec))
                if not (x and self.load(x).steps):
                    continue
                w = windows(self.load(x), 50)
                b = self._blowup_of(x)
                last = self.load(x).steps[-1]
                series.append(dict(label=f"seed {sd}" + (f" (B {b})" if b else "") + ("" if last == self.steps else f" [cut {last}]"),
                                   x=[v["step"] for v in w], y=[v["mean"] for v in w], color=COLORS[i % 10], width=1.1))
            if series:
                panels.append(dict(ylabel=f"{prec}: loss (50-step mean), log", log=True, series=series))
        if panels:
            svg_figure(self._path("plots", f"{tag}_loss_all_seeds.svg"), panels, (0, self.steps),
                       f"{tag}: every baseline, loss (B = blow-up step)", panel_h=230)
        # The probe on every MX seed (rolling mean of 5 probes).
        mxs = [(sd, self.base.get((tag, sd, MX))) for sd in seeds]
        mxs = [(sd, x) for sd, x in mxs if x and self.load(x).probes]
        if mxs:
            self._plot_probe_all_seeds(tag, seeds, mxs)
        # The onset of each MX blow-up, every step.
        onsets = [(sd, x, self._blowup_of(x)) for sd, x in mxs if self._blowup_of(x)]
        if onsets:
            self._plot_onset(tag, onsets)

    def _plot_probe_all_seeds(self, tag, seeds, mxs):
        vlines = [(self._blowup_of(x), f"B seed {sd}", COLORS[i % 10]) for i, (sd, x) in enumerate(mxs) if self._blowup_of(x)]

        def every_mx(key, n):
            out = []
            for i, (sd, x) in enumerate(mxs):
                xs, ys = self._rolled(x, key, n)
                diverges = bool(self._blowup_of(x))
                out.append(dict(label=f"MX seed {sd}" + (" (diverges)" if diverges else ""), x=xs, y=ys, color=COLORS[i % 10],
                                dash=None if diverges else "3,2"))
            return out

        def one(entry, key, n, label):
            xs, ys = self._rolled(entry, key, n)
            return [dict(label=label, x=xs, y=ys, color="#000", dash="1,2")]

        bf = self.base.get((tag, seeds[0], "bf16"))
        fp = self.base.get((tag, seeds[0], "fp32"))
        has_bf = bf and self.load(bf).probes
        has_fp = fp and self.load(fp).probes
        first_probe = self.load(mxs[0][1]).probes[0]
        last_block = max(0, len([k for k in first_probe if k.endswith("_zeta") and k.startswith("L")]) - 1)
        svg_figure(self._path("plots", f"{tag}_probe_all_seeds.svg"), [
            dict(ylabel="probe cosine, mean of the last 5 probes",
                 series=every_mx("cosine", 5) + (one(bf, "cosine", 5, f"bf16 seed {seeds[0]}") if has_bf else []), vlines=vlines),
            dict(ylabel="probe zeta overall, mean of the last 5 probes",
                 series=every_mx("zeta", 5) + (one(bf, "zeta", 5, f"bf16 seed {seeds[0]}") if has_bf else []), vlines=vlines),
            dict(ylabel="probe zeta of the last block, mean of the last 5 probes", series=every_mx(f"L{last_block}_zeta", 5), vlines=vlines),
            dict(ylabel="saturated fraction, max over linears and roles (probe steps)", series=every_mx("sat_max", 1), vlines=vlines),
            dict(ylabel="LN gamma mean, block 0",
                 series=every_mx("gamma0_mean", 1) + (one(fp, "gamma0_mean", 1, f"fp32 seed {seeds[0]}") if has_fp else []), vlines=vlines),
        ], (0, self.steps), f"{tag}: the probe on every MX seed (solid: the diverging ones)")

    def _plot_onset(self, tag, onsets):
        loss, gnorm, sat = [], [], []
        for i, (sd, x, b) in enumerate(onsets):
            r = self.load(x)
            idx = [j for j, s in enumerate(r.steps) if b - 600 <= s <= b + 100]
            xs = [r.steps[j] - b for j in idx]
            color = COLORS[i % 10]
            loss.append(dict(label=f"MX seed {sd} (B={b})", x=xs, y=[r.loss[j] for j in idx], color=color))
            gnorm.append(dict(label=f"MX seed {sd}", x=xs, y=[r.grad_norm[j] for j in idx], color=color))
            sat.append(dict(label=f"MX seed {sd}", x=xs, y=[r.sat_max[j] for j in idx], color=color))
        ref0 = self.blow[onsets[0][1].id][0]
        loss.append(dict(label=f"10 x ref of seed {onsets[0][0]}", x=[-600, 100], y=[10 * ref0, 10 * ref0], color="#000", dash="4,3"))
        vb = [(0, "B", "#000")]
        svg_figure(self._path("plots", f"{tag}_onset.svg"), [
            dict(ylabel="loss (every step), log", log=True, series=loss, vlines=vb),
            dict(ylabel="grad norm (global, before the update), log", log=True, series=gnorm, vlines=vb),
            dict(ylabel="saturated fraction, max over linears and roles", series=sat, vlines=vb)],
            (-150, 25), f"{tag}: blow-up onset, every step (x = step - B)", xlabel="step - B")

    def plot_diverged(self, x):
        """plots/TAG_seedS_probe.svg, _probe_zoom.svg and _interventions.svg of a diverged MX
        baseline x."""
        b = self._blowup_of(x)
        tag, sd = x.tag, x.seed
        r = self.load(x)
        fp = self.base.get((tag, sd, "fp32"))
        bf = self.base.get((tag, sd, "bf16"))
        c = criteria.resume_step(b)
        vlines = [(b, f"blow-up {b}", "#d62728"), (c, f"C {c}", "#555")]
        loss = [self._windowed(x, MX, "#d62728")]
        if bf:
            loss.append(self._windowed(bf, "bf16", "#1f77b4"))
        if fp:
            loss.append(self._windowed(fp, "fp32", "#000", "4,3"))
        n_layers = sum(1 for k in r.probes[0] if k.startswith("L") and k.endswith("_zeta")) if r.probes else 0
        n_gammas = sum(1 for k in r.probes[0] if k.startswith("gamma") and k.endswith("_mean")) if r.probes else 0
        ps = self._probe_series
        panels = [
            dict(ylabel="loss (10-step mean), log", log=True, series=loss, vlines=vlines),
            dict(ylabel="probe cosine(g_q, g)",
                 series=[ps(x, "cosine", "MX", "#d62728")] + ([ps(bf, "cosine", "bf16", "#1f77b4")] if bf else []), vlines=vlines),
            dict(ylabel="probe zeta = <g_q - g, g>/|g|^2",
                 series=[ps(x, "zeta", "MX overall", "#d62728", None)]
                 + [ps(x, f"L{i}_zeta", f"MX block {i}", COLORS[(i + 2) % 10], "3,2") for i in range(n_layers)]
                 + ([ps(bf, "zeta", "bf16 overall", "#1f77b4")] if bf else []), vlines=vlines),
            dict(ylabel="probe rel_error |g_q - g|/|g|",
                 series=[ps(x, "rel_error", "MX", "#d62728")] + ([ps(bf, "rel_error", "bf16", "#1f77b4")] if bf else []), vlines=vlines),
            dict(ylabel="saturated (clipped) fraction, mean over linears",
                 series=[ps(x, f"sat_{ro}", ro, COLORS[i]) for i, ro in enumerate(ROLES)] + [ps(x, "sat_max", "max over linears+roles", "#000", "4,3")],
                 vlines=vlines),
            dict(ylabel="LN gamma mean per block",
                 series=[ps(x, f"gamma{i}_mean", f"MX block {i}", COLORS[i % 10]) for i in range(n_gammas)]
                 + ([ps(fp, f"gamma{i}_mean", f"fp32 block {i}", COLORS[i % 10], "4,3") for i in range(n_gammas)] if fp else []),
                 vlines=vlines),
        ]
        svg_figure(self._path("plots", f"{tag}_seed{sd}_probe.svg"), panels, (0, self.steps),
                   f"{tag} seed {sd}: MX vs bf16 vs fp32 (probe every 50 steps)")
        lo, hi = max(0, b - 1500), min(self.steps, b + 500)
        svg_figure(self._path("plots", f"{tag}_seed{sd}_probe_zoom.svg"), panels, (lo, hi), f"{tag} seed {sd}: steps {lo}-{hi}")
        group = [y for y in self.resumed if y.tag == tag and y.seed == sd and y.kind != "regen"]
        if not group:
            return
        series = [self._windowed(x, "MX baseline (uninterrupted)", "#bbbbbb", None, 4, 50)]
        for i, name in enumerate(["control"] + INTERVENTION_NAMES):
            y = next((y for y in group if y.prec == name), None)
            if y and self.load(y).steps:
                if name == "control":
                    series.append(self._windowed(y, "MX control (resumed)", "#000", "2,2", 1.2, 50))
                else:
                    series.append(self._windowed(y, name, COLORS[i], None, 1.2, 50))
        if fp:
            series.append(self._windowed(fp, "fp32 baseline (from step 0)", "#000", "8,4", 1.5, 50))
        start = group[0].resume
        svg_figure(self._path("plots", f"{tag}_seed{sd}_interventions.svg"),
                   [dict(ylabel="loss (50-step mean), log", log=True, series=series, vlines=vlines)],
                   (max(0, start - 500), self.steps), f"{tag} seed {sd}: interventions from step {start}", panel_h=360)

    # ---------------------------------------------------------------- everything

    def write(self):
        """Writes every output file; returns the text of summary.md."""
        for sub in SUBDIRS:
            os.makedirs(self._path(sub), exist_ok=True)
        md = ["# MX instability reproduction: summary (written by scripts/reproduce-mx-instability)", "", CRITERION, ""]
        md += self.baselines()
        md += self.interventions()
        md += self.bitexact()
        md += self.probes_around_blowups()
        for tag in sorted({x.tag for x in self.entries}):
            self.plot_tag(tag)
        for x in self.mx_baselines:
            if self._blowup_of(x):
                self.plot_diverged(x)
        text = "\n".join(md) + "\n"
        with open(self._path("summary.md"), "w") as f:
            f.write(text)
        return text


def write_report(work, out, steps):
    """Report(work, out, steps).write()."""
    return Report(work, out, steps).write()
