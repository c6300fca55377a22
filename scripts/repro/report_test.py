"""Tests of report.py: the tables of summary.md, the CSVs and which plots are drawn, from a small
synthetic work directory."""
import csv
import math
import os
import tempfile
import unittest

from repro import report
from repro.runs import ManifestEntry
from repro.synthetic import loss_curve, metric_line

STEPS = 6200  # the reference window is steps 5001..6000
QUANT = {"blocks.0.fc1": {"fwd_x": 0.01, "fwd_w": 0.02}, "blocks.1.fc1": {"fwd_x": 0.03, "wgrad_dy": 0.04}}
PROBE = (0.9, 0.4, -0.2, {"0": (0.9, 0.4, -0.1), "1": (0.8, 0.5, -0.3)})
GAMMA = {"b.0.ln": (1.0, 0.01), "b.1.ln": (1.1, 0.01)}


def table(md, first_header):
    """The rows of the first markdown table whose header row starts with `| first_header |`, as
    dicts."""
    lines = md.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in line.strip("|").split("|")])))
    return rows


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.work = os.path.join(self.dir.name, "work")
        self.out = os.path.join(self.dir.name, "out")
        os.makedirs(self.work)
        self.entries = []

    def tearDown(self):
        self.dir.cleanup()

    def add(self, entry, losses, first_step=1, mx=True, probes=True, grad_norm_of=None):
        """Writes a run: quant in every line of an MX run, probe and LN gamma every 50 steps."""
        self.entries.append(entry)
        d = os.path.join(self.work, entry.id)
        os.makedirs(d)
        with open(os.path.join(d, "metrics.jsonl"), "w") as f:
            for i, loss in enumerate(losses):
                s = first_step + i
                at_probe = probes and s % 50 == 0
                f.write(metric_line(s, loss, grad_norm=grad_norm_of(s) if grad_norm_of else 0.5,
                                    quant=QUANT if mx else None, probe=PROBE if at_probe else None,
                                    ln_gamma=GAMMA if s % 50 == 0 else None) + "\n")

    def write(self):
        with open(os.path.join(self.work, "manifest.tsv"), "w") as f:
            f.writelines(e.line() for e in self.entries)
        return report.write_report(self.work, self.out, STEPS)

    def csv_rows(self, *path):
        with open(os.path.join(self.out, *path)) as f:
            return list(csv.DictReader(f))

    def diverged_seed_1(self):
        """Seed 1: MX blows up at 6150 (a non-finite loss at 6160); bf16 and fp32 stay flat."""
        mx = loss_curve(STEPS, 0.002, {s: 1.0 for s in range(6150, STEPS + 1)})
        mx[6160 - 1] = math.inf
        self.add(ManifestEntry("canon-mxfp8_e4m3-s1", "baseline", "canon", 1, "mxfp8_e4m3", None), mx)
        self.add(ManifestEntry("canon-bf16-s1", "baseline", "canon", 1, "bf16", None), loss_curve(STEPS, 0.002), mx=False)
        self.add(ManifestEntry("canon-fp32-s1", "baseline", "canon", 1, "fp32", None), loss_curve(STEPS, 0.0025),
                 mx=False, probes=False)
        return mx

    def test_baselines_table_and_csv(self):
        self.diverged_seed_1()
        # Seed 2: MX's own window is 4x its fp32's: the fp32 ref is used, and 0.008 < 10 x 0.002.
        self.add(ManifestEntry("canon-mxfp8_e4m3-s2", "baseline", "canon", 2, "mxfp8_e4m3", None), loss_curve(STEPS, 0.008))
        self.add(ManifestEntry("canon-fp32-s2", "baseline", "canon", 2, "fp32", None), loss_curve(STEPS, 0.002), mx=False, probes=False)
        md = self.write()
        rows = table(md, "config")
        self.assertEqual([(r["seed"], r["precision"]) for r in rows],
                         [("1", "mxfp8_e4m3"), ("2", "mxfp8_e4m3"), ("1", "bf16"), ("1", "fp32"), ("2", "fp32")])
        mx1, mx2, bf1 = rows[0], rows[1], rows[2]
        self.assertEqual((mx1["ref (median 5001-6000)"], mx1["blow-up"], mx1["first loss > 0.1"], mx1["steps>10ref"]),
                         ("0.002", "6150", "6150", "51"))
        self.assertEqual((mx1["final loss"], mx1["max loss after step 1000 (step)"], mx1["final / fp32 final"]), ("1", "inf (6160)", "400"))
        self.assertEqual((mx2["ref (median 5001-6000)"], mx2["blow-up"], mx2["steps>10ref"]), ("0.002 (fp32)", "none", "0"))
        self.assertEqual(bf1["final / fp32 final"], "0.8")
        by_id = {(r["seed"], r["precision"]): r for r in self.csv_rows("baselines.csv")}
        self.assertEqual(by_id[("2", "mxfp8_e4m3")]["ref_source"], "fp32 (own window polluted)")
        self.assertEqual((by_id[("1", "mxfp8_e4m3")]["blowup"], by_id[("1", "bf16")]["blowup"]), ("6150", ""))
        self.assertEqual(by_id[("1", "mxfp8_e4m3")]["max"], "inf")
        self.assertNotIn("## Interventions", md)
        self.assertFalse(os.path.exists(os.path.join(self.out, "interventions.csv")))

    def test_per_run_csvs(self):
        self.diverged_seed_1()
        self.write()
        series = self.csv_rows("series", "canon-mxfp8_e4m3-s1.csv")
        self.assertEqual(list(series[0]), report.SERIES_COLUMNS)
        self.assertEqual(len(series), STEPS // 10)
        self.assertEqual((series[0]["step"], series[0]["mean"]), ("10", "0.002"))
        probe = self.csv_rows("probe", "canon-mxfp8_e4m3-s1.csv")
        self.assertEqual(len(probe), STEPS // 50)
        self.assertEqual((probe[0]["L1_zeta"], probe[0]["sat_max"], probe[0]["sat_fwd_x"], probe[0]["sat_dgrad_dy"]), ("-0.3", "0.04", "0.02", ""))
        quant = self.csv_rows("quant", "canon-mxfp8_e4m3-s1.csv")
        self.assertEqual(quant[0]["blocks.1.fc1.wgrad_dy"], "0.04")
        self.assertFalse(os.path.exists(os.path.join(self.out, "quant", "canon-bf16-s1.csv")))  # no quantized operand
        # A run without a probe (fp32) still gets rows every 50 steps: loss, LN gamma.
        fp32 = self.csv_rows("probe", "canon-fp32-s1.csv")
        self.assertEqual((fp32[0]["step"], fp32[0]["gamma1_mean"]), ("50", "1.1"))
        self.assertNotIn("cosine", fp32[0])
        window = self.csv_rows("window", "canon-mxfp8_e4m3-s1.csv")
        self.assertEqual((window[0]["step"], window[-1]["step"]), ("5550", "6200"))  # B - 600 .. the last step

    def test_interventions_and_bitexactness(self):
        mx = self.diverged_seed_1()
        c = 5700
        self.add(ManifestEntry("canon-s1-regen", "regen", "canon", 1, "mxfp8_e4m3", 5500), mx[5500:c], first_step=5501)
        control = mx[c:]
        control[6000 - c - 1] = 0.0021  # one step differs from the baseline
        self.add(ManifestEntry("canon-s1-control", "control", "canon", 1, "control", c), control, first_step=c + 1)
        self.add(ManifestEntry("canon-s1-iv-fp32", "iv", "canon", 1, "fp32", c), loss_curve(STEPS, 0.002)[c:], first_step=c + 1, mx=False)
        late = loss_curve(STEPS, 0.002, {s: 1.0 for s in range(6180, STEPS + 1)})[c:]
        self.add(ManifestEntry("canon-s1-iv-bump_exponent", "iv", "canon", 1, "bump_exponent", c), late, first_step=c + 1)
        md = self.write()
        rows = {r["run"]: r for r in table(md, "config | seed | run | C")}
        self.assertEqual(list(rows), ["control", "fp32", "bump_exponent"])
        self.assertEqual((rows["control"]["C"], rows["control"]["MX blow-up B (B-C)"], rows["control"]["blow-up"], rows["control"]["delay vs B"]),
                         ("5700", "6150 (450)", "6150", "0"))
        self.assertEqual((rows["fp32"]["blow-up"], rows["fp32"]["delay vs B"], rows["fp32"]["final / fp32 final"]), ("none", "-", "0.8"))
        self.assertEqual((rows["bump_exponent"]["blow-up"], rows["bump_exponent"]["delay vs B"], rows["bump_exponent"]["steps>10ref"]),
                         ("6180", "+30", "21"))
        bit = {r["run"]: r for r in self.csv_rows("bitexact.csv")}
        self.assertEqual({k: bit["control"][k] for k in ("first", "last", "steps_expected", "steps_compared", "identical", "first_mismatch")},
                         {"first": "5701", "last": "6200", "steps_expected": "500", "steps_compared": "500", "identical": "499", "first_mismatch": "6000"})
        self.assertEqual((bit["regen"]["identical"], bit["regen"]["first_mismatch"]), ("200", ""))
        bit_md = {r["run"]: r for r in table(md, "config | seed | run | steps")}
        self.assertEqual((bit_md["control"]["steps"], bit_md["regen"]["first mismatch"]), ("5701..6200", "none"))

    def test_probe_section_and_plots(self):
        self.diverged_seed_1()
        self.add(ManifestEntry("canon-mxfp8_e4m3-s2", "baseline", "canon", 2, "mxfp8_e4m3", None), loss_curve(STEPS, 0.002))
        self.add(ManifestEntry("canon-s1-control", "control", "canon", 1, "control", 5700),
                 loss_curve(STEPS, 0.002)[5700:], first_step=5701)
        md = self.write()
        self.assertIn("### canon seed 1: blow-up at step 6150", md)
        self.assertNotIn("### canon seed 2", md)
        probe_rows = table(md, "step")
        self.assertEqual((probe_rows[0]["step"], probe_rows[-1]["step"]), ("5150", "6200"))  # B - 1000 .. the last step
        self.assertEqual(probe_rows[0]["zeta per layer"], "-0.1, -0.3")
        self.assertEqual(probe_rows[0]["LN gamma mean per layer"], "1, 1.1")
        plots = sorted(os.listdir(os.path.join(self.out, "plots")))
        self.assertEqual(plots, ["canon_loss_all_seeds.svg", "canon_onset.svg", "canon_probe_all_seeds.svg",
                                 "canon_seed1_interventions.svg", "canon_seed1_probe.svg", "canon_seed1_probe_zoom.svg"])
        with open(os.path.join(self.out, "plots", "canon_loss_all_seeds.svg")) as f:
            svg = f.read()
        self.assertIn("seed 1 (B 6150)", svg)
        self.assertIn(">seed 2<", svg)
        with open(os.path.join(self.out, "summary.md")) as f:
            self.assertEqual(f.read(), md)

    def test_more_blocks_than_colors(self):
        # 12 LN gains (a 12-block model): the per-block plot cycles the 10 colors.
        gamma = {f"blocks.{i}.ln.weight": (1.0 + i / 100, 0.01) for i in range(12)}
        mx = loss_curve(STEPS, 0.002, {s: 1.0 for s in range(6150, STEPS + 1)})
        self.entries.append(ManifestEntry("canon-mxfp8_e4m3-s1", "baseline", "canon", 1, "mxfp8_e4m3", None))
        os.makedirs(os.path.join(self.work, "canon-mxfp8_e4m3-s1"))
        with open(os.path.join(self.work, "canon-mxfp8_e4m3-s1", "metrics.jsonl"), "w") as f:
            for i, loss in enumerate(mx):
                f.write(metric_line(i + 1, loss, quant=QUANT, ln_gamma=gamma) + "\n")
        self.write()
        with open(os.path.join(self.out, "plots", "canon_seed1_probe.svg")) as f:
            svg = f.read()
        lines = svg.splitlines()
        # A legend entry is a line in the series' color, then its label.
        legend_10 = lines[next(i for i, l in enumerate(lines) if l.endswith(">MX block 10</text>")) - 1]
        legend_11 = lines[next(i for i, l in enumerate(lines) if l.endswith(">MX block 11</text>")) - 1]
        self.assertIn(f'stroke="{report.COLORS[0]}"', legend_10)
        self.assertIn(f'stroke="{report.COLORS[1]}"', legend_11)
        probe = self.csv_rows("probe", "canon-mxfp8_e4m3-s1.csv")
        # gammaN is the N-th LN gain in name order, as the shell version numbered them: with more
        # than 10 blocks, blocks.10 comes third.
        self.assertEqual((probe[0]["gamma2_mean"], probe[0]["gamma11_mean"]), ("1.1", "1.09"))


class FormatTest(unittest.TestCase):
    def test_fmt(self):
        self.assertEqual([report.fmt(v) for v in (None, 0.000123456, 7, math.inf, math.nan, 2.0)],
                         ["-", "0.0001235", "7", "inf", "nan", "2"])
        self.assertEqual(report.fmt(0.123456, 2), "0.12")

    def test_write_csv(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.csv")
            report.write_csv(path, [dict(a=1, b=0.1234567), dict(b=None, c="x")])
            with open(path) as f:
                self.assertEqual(f.read().splitlines(), ["a,b,c", "1,0.123457,", ",,x"])
            report.write_csv(os.path.join(d, "none.csv"), [])
            self.assertFalse(os.path.exists(os.path.join(d, "none.csv")))

    def test_seed_order_and_rolling_mean(self):
        self.assertEqual(report.seed_order({5, 1337, 1}), [1337, 1, 5])
        self.assertEqual(report.rolling_mean([1.0, None, 3.0, math.nan, 5.0], 2), [1.0, 1.0, 3.0, 3.0, 5.0])
        self.assertEqual(report.rolling_mean([None], 3), [None])


if __name__ == "__main__":
    unittest.main()
