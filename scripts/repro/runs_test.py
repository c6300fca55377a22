"""Tests of runs.py: reading metrics.jsonl lines and the manifest."""
import math
import os
import tempfile
import unittest

from repro import runs
from repro.synthetic import metric_line, write_run


class MetricNumberTest(unittest.TestCase):
    def test_numbers_read_as_floats(self):
        self.assertEqual(runs.metric_number(3), 3.0)
        self.assertEqual(runs.metric_number(0.25), 0.25)

    def test_non_finite_strings_read_as_their_values(self):
        self.assertTrue(math.isnan(runs.metric_number("NaN")))
        self.assertEqual(runs.metric_number("Infinity"), math.inf)
        self.assertEqual(runs.metric_number("-Infinity"), -math.inf)

    def test_anything_else_reads_as_nan(self):
        for v in (None, "inf", "1.5", True, {}, []):
            self.assertTrue(math.isnan(runs.metric_number(v)), v)


class ParseMetricLinesTest(unittest.TestCase):
    def test_skips_blank_cut_and_stepless_lines(self):
        lines = [metric_line(1, 0.5) + "\n", "\n", '{"loss": 1}\n', '{"step": "2", "loss": 1}\n',
                 metric_line(2, 0.4) + "\n", metric_line(3, 0.3)[:20]]
        self.assertEqual([m["step"] for m in runs.parse_metric_lines(lines)], [1, 2])

    def test_missing_file_reads_as_no_lines(self):
        self.assertEqual(runs.read_metric_lines("/nonexistent/metrics.jsonl"), [])


class ParseRunTest(unittest.TestCase):
    QUANT = {"blocks.0.fc1": {"fwd_x": 0.1, "fwd_w": 0.3}, "blocks.1.fc1": {"fwd_x": 0.2, "dgrad_dy": 0.05}}

    def test_per_step_lists_and_exact_values(self):
        r = runs.parse_run([metric_line(1, 0.5, grad_norm=2.0), metric_line(2, math.inf, grad_norm=math.nan)])
        self.assertEqual(r.steps, [1, 2])
        self.assertEqual(r.loss, [0.5, math.inf])
        self.assertTrue(math.isnan(r.grad_norm[1]))
        # The values as written: a bit-exact comparison must not go through float formatting.
        self.assertEqual(r.exact, [("0.5", "2.0"), ("'Infinity'", "'NaN'")])

    def test_saturation_max_and_mean_per_role(self):
        r = runs.parse_run([metric_line(1, 0.5, quant=self.QUANT), metric_line(2, 0.5)])
        self.assertEqual(r.sat_max, [0.3, None])
        self.assertAlmostEqual(r.sat_role[0]["fwd_x"], 0.15)
        self.assertEqual(r.sat_role[0]["fwd_w"], 0.3)
        self.assertEqual(r.sat_role[0]["dgrad_dy"], 0.05)
        self.assertIsNone(r.sat_role[0]["wgrad_x"])
        self.assertIsNone(r.sat_role[1]["fwd_x"])

    def test_probe_rows_at_probe_lines_and_every_50_steps(self):
        lines = [metric_line(s, 0.5) for s in range(1, 101)]
        lines[6] = metric_line(7, 0.5, probe=(0.9, 0.4, -0.2, {"1": (0.8, 0.5, -0.3), "0": (0.7, 0.6, -0.1)}),
                               ln_gamma={"b.1": (1.1, 0.01), "b.0": (1.0, 0.02)}, quant=self.QUANT)
        r = runs.parse_run(lines)
        self.assertEqual([p["step"] for p in r.probes], [7, 50, 100])
        row = r.probes[0]
        self.assertEqual(list(row), ["step", "loss", "grad_norm", "cosine", "rel_error", "zeta",
                                     "L0_cosine", "L0_rel_error", "L0_zeta", "L1_cosine", "L1_rel_error", "L1_zeta",
                                     "sat_max"] + [f"sat_{r}" for r in runs.ROLES]
                         + ["gamma0_mean", "gamma0_std", "gamma1_mean", "gamma1_std"])
        self.assertEqual((row["L1_zeta"], row["gamma0_mean"], row["gamma1_mean"]), (-0.3, 1.0, 1.1))
        self.assertEqual(r.probe_quant[0], {"step": 7, "blocks.0.fc1.fwd_x": 0.1, "blocks.0.fc1.fwd_w": 0.3,
                                            "blocks.1.fc1.fwd_x": 0.2, "blocks.1.fc1.dgrad_dy": 0.05})
        self.assertNotIn("cosine", r.probes[1])  # step 50: no probe in the line

    def test_losses_only(self):
        r = runs.parse_run([metric_line(50, 0.5, quant=self.QUANT)], full=False)
        self.assertEqual(r.loss, [0.5])
        self.assertEqual((r.sat_max, r.probes), ([], []))

    def test_store_reads_each_run_once_and_a_missing_one_as_empty(self):
        with tempfile.TemporaryDirectory() as work:
            write_run(work, "a", [0.5, 0.4])
            store = runs.RunStore(work)
            self.assertIs(store.load("a"), store.load("a"))
            self.assertEqual(store.load("a").steps, [1, 2])
            self.assertEqual(store.load("missing").steps, [])


class ManifestTest(unittest.TestCase):
    def test_line_round_trip_and_first_entry_wins(self):
        a = runs.ManifestEntry("canon-mxfp8_e4m3-s1", "baseline", "canon", 1, "mxfp8_e4m3", None)
        b = runs.ManifestEntry("canon-s1-control", "control", "canon", 1, "control", 6100)
        again = runs.ManifestEntry("canon-s1-control", "control", "canon", 1, "control", 99)
        self.assertEqual(b.line(), "canon-s1-control\tcontrol\tcanon\t1\tcontrol\t6100\n")
        self.assertEqual(runs.parse_manifest([a.line(), b.line(), again.line()]), [a, b])

    def test_a_short_line_is_an_error_naming_it(self):
        with self.assertRaisesRegex(ValueError, "'x\\\\tbaseline'.*want 6 tab-separated fields.*have 2"):
            runs.parse_manifest(["x\tbaseline\n"])

    def test_missing_manifest_is_empty(self):
        self.assertEqual(runs.read_manifest(os.path.join("/nonexistent", "manifest.tsv")), [])


if __name__ == "__main__":
    unittest.main()
