"""Tests of criteria.py: the blow-up criterion, the per-run statistics and the checkpoint plan."""
import math
import tempfile
import unittest
from unittest import mock

from repro import criteria
from repro.runs import ManifestEntry, RunMetrics, RunStore
from repro.synthetic import loss_curve, write_run


def run(losses, first_step=1, grad_norm=None):
    steps = list(range(first_step, first_step + len(losses)))
    return RunMetrics(steps=steps, loss=list(losses), grad_norm=grad_norm or [0.5] * len(losses),
                      exact=[(repr(l), "0.5") for l in losses])


class StatisticsTest(unittest.TestCase):
    def test_median_window(self):
        r = run([1.0, 5.0, 2.0, 3.0])
        self.assertEqual(criteria.median_window(r, 2, 4), 3.0)
        self.assertIsNone(criteria.median_window(r, 10, 20))

    def test_blowup_searches_after_step_1000_only(self):
        # Over 10 ref at step 500 (the initial descent) and at 1001 and after.
        r = run(loss_curve(1200, level=1.0, spikes={500: 50.0, 1001: 11.0, 1100: 20.0}))
        self.assertEqual(criteria.blowup(r, 1.0), (1000, 1001))
        # Exactly 10 ref is not over it.
        self.assertEqual(criteria.blowup(run(loss_curve(1200, 1.0, {1005: 10.0})), 1.0), (1000, None))

    def test_blowup_non_finite_and_resumed_runs(self):
        r = run(loss_curve(3000, 1.0, {1500: math.nan, 2500: math.inf}))
        self.assertEqual(criteria.blowup(r, 1.0), (1000, 1500))
        self.assertEqual(criteria.blowup(r, 1.0, start_step=2000), (2000, 2500))
        self.assertEqual(criteria.blowup(r, None), (1000, None))

    def test_count_over(self):
        r = run(loss_curve(20, 1.0, {3: 11.0, 10: math.nan, 15: 12.0}))
        self.assertEqual(criteria.count_over(r, 1.0), 3)
        self.assertEqual(criteria.count_over(r, 1.0, after=10), 1)
        self.assertIsNone(criteria.count_over(r, None))

    def test_min_and_max_loss_count_non_finite_as_inf(self):
        r = run([3.0, 1.0, math.nan, 2.0, 1.0])
        self.assertEqual(criteria.min_loss(r), (2, 1.0))  # the first of equal minima
        self.assertEqual(criteria.max_loss(r), (3, math.inf))
        self.assertEqual(criteria.max_loss(r, after=3), (4, 2.0))
        self.assertEqual(criteria.max_loss(run([])), (None, None))

    def test_mean_last(self):
        self.assertEqual(criteria.mean_last(run([9.0] + [1.0] * 100)), 1.0)
        self.assertEqual(criteria.mean_last(run([1.0, 3.0]), n=1), 3.0)
        self.assertIsNone(criteria.mean_last(run([])))

    def test_windows(self):
        r = run([1.0, 3.0, 2.0, math.nan, 4.0], grad_norm=[0.1, 0.2, 0.3, 0.4, 0.5])
        w = criteria.windows(r, n=2)
        self.assertEqual([x["step"] for x in w], [2, 4, 5])
        self.assertEqual((w[0]["mean"], w[0]["min"], w[0]["max"], w[0]["loss"], w[0]["gnorm"]), (2.0, 1.0, 3.0, 3.0, 0.2))
        # A non-finite loss: left out of mean and min, max is inf.
        self.assertEqual((w[1]["mean"], w[1]["min"], w[1]["max"]), (2.0, 2.0, math.inf))
        self.assertEqual((w[2]["mean"], w[2]["gnorm"]), (4.0, 0.5))

    def test_exact_compare(self):
        a = run([1.0, 2.0, 3.0, 4.0])
        b = run([2.0, 3.5, 4.0], first_step=2)
        # Steps 2..5: both have 2, 3, 4; 3 differs.
        self.assertEqual(criteria.exact_compare(a, b, 2, 5), (3, 2, 3, 4))
        self.assertEqual(criteria.exact_compare(a, a, 1, 4), (4, 4, None, 4))


class ReferenceAndPlanTest(unittest.TestCase):
    STEPS = 6200

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.work = self.dir.name

    def tearDown(self):
        self.dir.cleanup()

    def baseline(self, seed, prec, losses):
        write_run(self.work, f"canon-{prec}-s{seed}", losses)
        return ManifestEntry(f"canon-{prec}-s{seed}", "baseline", "canon", seed, prec, None)

    def test_reference_own_or_fp32_when_polluted(self):
        # Seed 1: MX's own window is 4x fp32's: polluted. Seed 2: 2x: its own.
        entries = [self.baseline(1, "mxfp8_e4m3", loss_curve(self.STEPS, 0.008)),
                   self.baseline(1, "fp32", loss_curve(self.STEPS, 0.002)),
                   self.baseline(2, "mxfp8_e4m3", loss_curve(self.STEPS, 0.004)),
                   self.baseline(2, "fp32", loss_curve(self.STEPS, 0.002)),
                   self.baseline(3, "bf16", loss_curve(100, 0.002))]
        refs = criteria.reference_losses(entries, RunStore(self.work))
        self.assertEqual(refs[("canon", 1, "mxfp8_e4m3")],
                         criteria.Reference(0.002, "fp32 (own window polluted)", 0.008, 0.002))
        self.assertEqual(refs[("canon", 2, "mxfp8_e4m3")], criteria.Reference(0.004, "own", 0.004, 0.002))
        self.assertEqual(refs[("canon", 3, "bf16")], criteria.Reference(None, "own", None, None))

    def test_resume_step(self):
        self.assertEqual(criteria.resume_step(7229), 6800)
        self.assertEqual(criteria.resume_step(8474), 8000)
        self.assertEqual(criteria.resume_step(1400), 1000)

    def test_plan_of_complete_diverged_mx_baselines(self):
        entries = [
            self.baseline(1, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {6150: 1.0})),  # C 5700 from P 5500
            self.baseline(2, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {5400: 1.0})),  # C 5000 = P
            self.baseline(3, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {1200: 1.0})),  # C 800, P 500
            self.baseline(4, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002)),  # stable
            self.baseline(5, "mxfp8_e4m3", loss_curve(self.STEPS - 1, 0.002, {5400: 1.0})),  # cut short
            self.baseline(6, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {1001: 1.0})),  # C 600, P 500
            self.baseline(1, "bf16", loss_curve(self.STEPS, 0.002, {6150: 1.0})),  # not MX
        ]
        plan = criteria.checkpoint_plan(entries, RunStore(self.work, full=False), self.STEPS, "mxfp8_e4m3")
        self.assertEqual([p.line() for p in plan], ["canon 1 6150 5700 5500", "canon 2 5400 5000 5000",
                                                    "canon 3 1200 800 500", "canon 6 1001 600 500"])

    def test_plan_skips_resume_steps_below_500(self):
        # With the search from step 1000, C >= 600 always; an earlier search start reaches the rule.
        entries = [self.baseline(1, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {700: 1.0})),   # C 300
                   self.baseline(2, "mxfp8_e4m3", loss_curve(self.STEPS, 0.002, {900: 1.0}))]   # C 500
        with mock.patch.object(criteria, "SEARCH_FROM", 500):
            plan = criteria.checkpoint_plan(entries, RunStore(self.work, full=False), self.STEPS, "mxfp8_e4m3")
        self.assertEqual([p.line() for p in plan], ["canon 2 900 500 500"])


if __name__ == "__main__":
    unittest.main()
