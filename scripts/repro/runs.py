"""Reading what keel-train and the reproduction scripts leave in a work directory: the
metrics.jsonl lines of a run (the format of StepMetrics::ToJson, docs/train.md) and the
manifest.tsv that names every run.
"""
import dataclasses
import json
import math
import os

# The quantized operand roles of a linear layer, in the order the tables and CSVs use.
ROLES = ["fwd_x", "fwd_w", "dgrad_dy", "dgrad_w", "wgrad_dy", "wgrad_x"]

# The runs with a probe run it every 50 steps; a run without one (fp32) still gets a probe row
# (loss, saturation, LN gamma) at these steps.
PROBE_EVERY = 50

_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def metric_number(value):
    """A number of a metric line, with keel's one rule (worker/run/step_metrics.h, MetricLine): the
    strings "NaN", "Infinity" and "-Infinity" read as their values; anything else that is not a
    number (null, another string, a missing field) reads as NaN."""
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NON_FINITE.get(value, math.nan)
    return math.nan


def is_finite(x):
    return x is not None and math.isfinite(x)


def parse_metric_lines(lines):
    """The JSON objects of metrics.jsonl lines that have an integer "step". Blank lines and lines
    that do not parse (the last line of a killed run can be cut) are skipped."""
    out = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            m = json.loads(line)
        except ValueError:
            continue
        if not isinstance(m, dict) or not isinstance(m.get("step"), int) or isinstance(m["step"], bool):
            continue
        out.append(m)
    return out


def read_metric_lines(path):
    """parse_metric_lines of a file; [] when the file does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return parse_metric_lines(f)


@dataclasses.dataclass
class RunMetrics:
    """One run's metrics.jsonl as per-step lists (index i is the i-th line), and one row per probe
    step. With full=False only steps, loss, grad_norm and exact are filled."""
    steps: list = dataclasses.field(default_factory=list)
    loss: list = dataclasses.field(default_factory=list)
    grad_norm: list = dataclasses.field(default_factory=list)
    # (loss, grad_norm) exactly as written in the line, for bit-exactness checks.
    exact: list = dataclasses.field(default_factory=list)
    # The largest saturated fraction over every linear and role (None: no quantized operand).
    sat_max: list = dataclasses.field(default_factory=list)
    # Per role, the saturated fraction averaged over the linears (None: no such operand).
    sat_role: list = dataclasses.field(default_factory=list)
    # At probe steps: the probe/probe_layers values, saturation and LN gamma, one dict per row
    # (its keys are the columns of probe/ID.csv) ...
    probes: list = dataclasses.field(default_factory=list)
    # ... and the saturated fraction of every linear and role ("step" and "LINEAR.ROLE" columns
    # of quant/ID.csv), parallel to probes.
    probe_quant: list = dataclasses.field(default_factory=list)


def _saturation(quant):
    """(sat_max, {role: mean over linears}) of a line's "quant" object."""
    by_role = {role: [] for role in ROLES}
    for roles in quant.values():
        for role, v in roles.items():
            if role in by_role:
                by_role[role].append(metric_number(v.get("saturated")))
    every = [x for values in by_role.values() for x in values]
    means = {role: (sum(v) / len(v) if v else None) for role, v in by_role.items()}
    return (max(every) if every else None), means


def _probe_row(m, step, sat_max, sat_role):
    row = {"step": step, "loss": metric_number(m.get("loss")), "grad_norm": metric_number(m.get("grad_norm"))}
    probe = m.get("probe")
    if probe:
        for k in ("cosine", "rel_error", "zeta"):
            row[k] = metric_number(probe.get(k))
        for layer, values in sorted(probe.get("layers", {}).items()):
            for k in ("cosine", "rel_error", "zeta"):
                row[f"L{layer}_{k}"] = metric_number(values.get(k))
    row["sat_max"] = sat_max
    for role in ROLES:
        row[f"sat_{role}"] = sat_role[role]
    for i, (_, gamma) in enumerate(sorted((m.get("ln_gamma") or {}).items())):
        row[f"gamma{i}_mean"] = metric_number(gamma.get("mean"))
        row[f"gamma{i}_std"] = metric_number(gamma.get("std"))
    return row


def parse_run(lines, full=True):
    """RunMetrics of metrics.jsonl lines."""
    r = RunMetrics()
    for m in parse_metric_lines(lines):
        step = m["step"]
        r.steps.append(step)
        r.loss.append(metric_number(m.get("loss")))
        r.grad_norm.append(metric_number(m.get("grad_norm")))
        r.exact.append((repr(m.get("loss")), repr(m.get("grad_norm"))))
        if not full:
            continue
        quant = m.get("quant") or {}
        sat_max, sat_role = _saturation(quant)
        r.sat_max.append(sat_max)
        r.sat_role.append(sat_role)
        if "probe" in m or step % PROBE_EVERY == 0:
            r.probes.append(_probe_row(m, step, sat_max, sat_role))
            qrow = {"step": step}
            for linear, roles in sorted(quant.items()):
                for role, v in roles.items():
                    qrow[f"{linear}.{role}"] = metric_number(v.get("saturated"))
            r.probe_quant.append(qrow)
    return r


class RunStore:
    """The runs of one work directory (WORK/ID/metrics.jsonl), each parsed once."""

    def __init__(self, work, full=True):
        self.work = work
        self.full = full
        self._runs = {}

    def load(self, run_id):
        """RunMetrics of WORK/run_id; empty when the run wrote no metrics."""
        if run_id not in self._runs:
            path = os.path.join(self.work, run_id, "metrics.jsonl")
            if os.path.exists(path):
                with open(path) as f:
                    self._runs[run_id] = parse_run(f, self.full)
            else:
                self._runs[run_id] = RunMetrics()
        return self._runs[run_id]


# ------------------------------------------------------------------ manifest.tsv

# What a run is: the baseline of a precision, the regeneration of a checkpoint, the unchanged
# continuation of a baseline (control) or an intervention.
KINDS = ("baseline", "regen", "control", "iv")


@dataclasses.dataclass(frozen=True)
class ManifestEntry:
    id: str
    kind: str      # one of KINDS
    tag: str       # the model/optimizer configuration ("canon", "L6-lr1e-3", ...)
    seed: int
    prec: str      # a baseline's precision, "control", or an intervention's name
    resume: object  # the step a resumed run starts from (int), None for a baseline

    def line(self):
        """The manifest.tsv line (with its newline)."""
        fields = [self.id, self.kind, self.tag, str(self.seed), self.prec, "" if self.resume is None else str(self.resume)]
        return "\t".join(fields) + "\n"


def parse_manifest(lines):
    """Manifest entries in file order; a run id listed again (every invocation appends its runs)
    keeps its first entry."""
    entries, seen = [], set()
    for line in lines:
        f = line.rstrip("\n").split("\t")
        if not f[0] or f[0] in seen:
            continue
        if len(f) != 6:
            raise ValueError(f"manifest line {line.rstrip()!r}: want 6 tab-separated fields "
                             f"(id, kind, tag, seed, precision, resume step), have {len(f)}")
        seen.add(f[0])
        entries.append(ManifestEntry(id=f[0], kind=f[1], tag=f[2], seed=int(f[3]), prec=f[4],
                                     resume=int(f[5]) if f[5] else None))
    return entries


def read_manifest(path):
    """parse_manifest of a file; [] when it does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return parse_manifest(f)
