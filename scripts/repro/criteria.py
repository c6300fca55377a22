"""The blow-up criterion of docs/reproductions/mx-instability.md and the per-run statistics of
its tables: reference loss, blow-up step, loss extremes, 10-step windows, bit-exact comparison,
and the checkpoint plan for the interventions.

A run is a runs.RunMetrics; a missing value is None.
"""
import dataclasses
import math
import statistics

from .runs import is_finite

# ref = the median loss over these steps of the run itself.
REF_WINDOW = (5001, 6000)
# A run's own ref over this many times its seed's fp32 ref means the window already holds a
# spike; the fp32 ref is used instead.
POLLUTED_FACTOR = 3
# Blow-up: a loss over this many times ref (or a non-finite loss) ...
BLOWUP_FACTOR = 10
# ... after this step: the initial descent (and its noise above 10 ref) ends by step ~300 in
# every run.
SEARCH_FROM = 1000
# Interventions resume from the newest multiple of CHECKPOINT_GRID at or before B - LEAD (the
# checkpoint a checkpoint_every=100 run would offer), ...
LEAD = 400
CHECKPOINT_GRID = 100
# ... regenerated from the baseline's checkpoint at the multiple of BASELINE_CHECKPOINT_EVERY at
# or below it; none before step MIN_RESUME.
BASELINE_CHECKPOINT_EVERY = 500
MIN_RESUME = 500


def median_window(r, first, last):
    """Median loss over steps first..last; None when the run has none of them."""
    v = [l for s, l in zip(r.steps, r.loss) if first <= s <= last]
    return statistics.median(v) if v else None


def is_over(loss, ref):
    """The blow-up test of one step's loss."""
    return not is_finite(loss) or loss > BLOWUP_FACTOR * ref


def blowup(r, ref, start_step=None):
    """(settle, B): the search starts after settle = max(SEARCH_FROM, start_step); B = the first
    step after it whose loss is over BLOWUP_FACTOR x ref or non-finite, None if none (or no ref)."""
    settle = max(SEARCH_FROM, start_step or 0)
    if ref is None or not r.steps:
        return settle, None
    for s, l in zip(r.steps, r.loss):
        if s > settle and is_over(l, ref):
            return settle, s
    return settle, None


def count_over(r, ref, after=0):
    """Steps after `after` whose loss is over BLOWUP_FACTOR x ref or non-finite; None without ref."""
    if ref is None:
        return None
    return sum(1 for s, l in zip(r.steps, r.loss) if s > after and is_over(l, ref))


def loss_extreme(r, better, after=0):
    """(step, loss) of the first step after `after` whose loss no other step beats by
    better(loss, best); a non-finite loss counts as inf. (None, None) for no such step."""
    best = None
    for s, l in zip(r.steps, r.loss):
        if s <= after:
            continue
        v = l if is_finite(l) else math.inf
        if best is None or better(v, best[1]):
            best = (s, v)
    return best or (None, None)


def min_loss(r, after=0):
    return loss_extreme(r, lambda v, best: v < best, after)


def max_loss(r, after=0):
    return loss_extreme(r, lambda v, best: v > best, after)


def mean_last(r, n=100):
    """Mean loss of the last n lines; None for an empty run."""
    v = r.loss[-n:]
    return sum(v) / len(v) if v else None


def windows(r, n=10):
    """The run in windows of n lines: the window's last step, the mean / min of its finite losses
    (NaN if none), its max (inf if any loss is non-finite), its last loss and grad norm."""
    out = []
    for i in range(0, len(r.steps), n):
        losses = r.loss[i:i + n]
        finite = [l for l in losses if is_finite(l)]
        last = min(i + n, len(r.steps)) - 1
        out.append(dict(step=r.steps[last],
                        mean=(sum(finite) / len(finite)) if finite else math.nan,
                        min=min(finite) if finite else math.nan,
                        max=max(losses) if finite and len(finite) == len(losses) else math.inf,
                        loss=losses[-1], gnorm=r.grad_norm[last]))
    return out


def exact_compare(a, b, first, last):
    """Compares (loss, grad_norm) as written, of runs a and b over steps first..last:
    (steps both have, steps identical, first differing step or None, steps in first..last)."""
    ea = {s: e for s, e in zip(a.steps, a.exact) if first <= s <= last}
    eb = {s: e for s, e in zip(b.steps, b.exact) if first <= s <= last}
    common = sorted(set(ea) & set(eb))
    identical = sum(1 for s in common if ea[s] == eb[s])
    mismatch = next((s for s in common if ea[s] != eb[s]), None)
    return len(common), identical, mismatch, last - first + 1


@dataclasses.dataclass(frozen=True)
class Reference:
    used: object   # the ref the criterion uses (None: the run has no step in REF_WINDOW)
    source: str    # "own", or "fp32 (own window polluted)"
    own: object    # the run's own median over REF_WINDOW
    fp32: object   # the same tag and seed's fp32 baseline's, None without one


def reference_losses(entries, store):
    """Reference per (tag, seed, precision) of every baseline in the manifest entries."""
    base = {(x.tag, x.seed, x.prec): x for x in entries if x.kind == "baseline"}
    refs = {}
    for (tag, seed, prec), x in base.items():
        own = median_window(store.load(x.id), *REF_WINDOW)
        fp = base.get((tag, seed, "fp32"))
        fp_ref = median_window(store.load(fp.id), *REF_WINDOW) if fp else None
        if own is not None and fp_ref is not None and own > POLLUTED_FACTOR * fp_ref:
            refs[(tag, seed, prec)] = Reference(fp_ref, "fp32 (own window polluted)", own, fp_ref)
        else:
            refs[(tag, seed, prec)] = Reference(own, "own", own, fp_ref)
    return refs


def resume_step(blowup_step):
    """C: the step interventions resume from, for a blow-up at blowup_step."""
    return (blowup_step - LEAD) // CHECKPOINT_GRID * CHECKPOINT_GRID


@dataclasses.dataclass(frozen=True)
class PlanEntry:
    """A diverged MX baseline: blow-up at B, interventions from C, C regenerated from the
    baseline's checkpoint at P (P == C: the baseline's own checkpoint serves)."""
    tag: str
    seed: int
    blowup: int
    resume: int
    source: int

    def line(self):
        return f"{self.tag} {self.seed} {self.blowup} {self.resume} {self.source}"


def checkpoint_plan(entries, store, steps, mx_precision):
    """PlanEntry of every complete (steps long) MX baseline that blew up late enough to resume
    before the blow-up, in manifest order."""
    refs = reference_losses(entries, store)
    plan = []
    for x in entries:
        if x.kind != "baseline" or x.prec != mx_precision:
            continue
        r = store.load(x.id)
        if not r.steps or r.steps[-1] < steps:
            continue
        _, b = blowup(r, refs[(x.tag, x.seed, x.prec)].used)
        if b is None:
            continue
        c = resume_step(b)
        if c < MIN_RESUME:
            continue
        plan.append(PlanEntry(x.tag, x.seed, b, c, c // BASELINE_CHECKPOINT_EVERY * BASELINE_CHECKPOINT_EVERY))
    return plan
