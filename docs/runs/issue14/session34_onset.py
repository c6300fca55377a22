#!/usr/bin/env python3
"""Session 34: how long before its blow-up an unprotected proxy run's loss starts to rise.

For each unprotected run that blew up (grids a, b, c2, d, e4, g, g8), the loss's 50-step median
every 5 steps over the 2000 steps before the blow-up; the onset is the earliest step from which
that median stays above 1.2x the lowest median before it, up to the blow-up. Prints one line per
run and the distribution of (blow-up step - onset). Run from the repository root."""
import collections
import csv
import json
import lzma
import statistics

R = "docs/runs/issue14/"
GRIDS = "a b c2 d e4 g-lr3e-4-seed1 g8-lr3e-4-seed1".split()
leads = []
for g in GRIDS:
    runs = {r["id"]: r for r in map(json.loads, open(R + f"grid-{g}-runs.jsonl"))}
    series = collections.defaultdict(dict)
    with lzma.open(R + f"grid-{g}-series.csv.xz", "rt") as f:
        for row in csv.DictReader(f):
            loss = float(row["loss"]) if row["loss"] not in ("", "nan") else float("inf")
            series[row["run"]][int(row["step"])] = loss
    for rid, r in sorted(runs.items()):
        if r["variant"] != "plain" or not r.get("blowup_step"):
            continue
        b, s = r["blowup_step"], series[rid]

        def median50(t):
            v = [s[k] for k in range(t - 49, t + 1) if k in s]
            return statistics.median(v) if v else float("inf")

        medians = {t: median50(t) for t in range(max(50, b - 2000), b + 1, 5)}
        lowest_before, low = {}, float("inf")
        for t in sorted(medians):
            lowest_before[t] = low
            low = min(low, medians[t])
        onset = b
        for t in sorted(medians, reverse=True):
            if medians[t] > 1.2 * lowest_before[t]:
                onset = t
            else:
                break
        leads.append(b - onset)
        print(f"grid-{g} {r['format']} L{r['layers']} d{r['width']} lr {r['lr']:g} seed {r['seed']}: "
              f"blow-up {b}, onset {onset}, {b - onset} steps")
print(f"{len(leads)} blow-ups: median {statistics.median(leads)} steps from onset to blow-up, max {max(leads)}, "
      f"within 100 steps: {sum(x <= 100 for x in leads)}")
