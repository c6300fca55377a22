"""Tests of mx_policy.py: the command line, the per-seed summary and CSV, and a whole call against
a stand-in keel-train (synthetic.FAKE_TRAINER)."""
import contextlib
import io
import json
import os
import tempfile
import unittest
from unittest import mock

from repro import mx_policy as mp
from repro.synthetic import encode, write_fake_trainer


def rows(losses, scheme="mxfp8_e4m3"):
    """Parsed metric lines of steps 1, 2, ... with these losses."""
    return [{"step": i + 1, "loss": encode(l), "scheme": scheme} for i, l in enumerate(losses)]


class ArgumentsTest(unittest.TestCase):
    def error(self, argv):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as cm:
            mp.parse_args(argv)
        self.assertEqual(cm.exception.code, 2)
        return err.getvalue()

    def test_out_dir_and_seeds(self):
        a = mp.parse_args(["out", "1337", "5", "0"])
        self.assertEqual((a.out_dir, a.seeds), ("out", [1337, 5, 0]))

    def test_bad_seeds_name_the_value_and_what_is_allowed(self):
        self.assertIn("argument SEED: '12a' is not an integer >= 0", self.error(["out", "12a"]))
        self.assertIn("argument SEED: '-3' is not an integer >= 0", self.error(["out", "-3"]))
        self.assertIn("SEED 5: given twice (want each seed once", self.error(["out", "5", "1", "5"]))
        self.assertIn("required: SEED", self.error(["out"]))
        self.assertIn("required: OUT_DIR, SEED", self.error([]))


class SummaryTest(unittest.TestCase):
    def test_summary_line(self):
        losses = [0.002] * 6200
        losses[6100 - 1] = 0.05  # over 10 x ref (0.002): the blow-up
        losses[6100:] = [0.003] * 100  # steps 6101..6200, the last 100
        r = rows(losses, scheme="bf16")
        # Step 6150 written twice, 0.9 then 0.003: its last line counts.
        r[6150 - 1]["loss"] = 0.9
        r.insert(6150, {"step": 6150, "loss": 0.003, "scheme": "bf16"})
        self.assertEqual(mp.summarize(5, r),
                         "seed 5: 6201 metric lines, final step 6200, final loss 0.003, mean of last 100 steps 0.003, "
                         "ref(median 5001-6000) 0.002, first step after 1000 with loss > 10 ref: 6100, final scheme bf16")

    def test_non_finite_loss_is_a_blowup_and_no_window_no_ref(self):
        losses = [0.002] * 2000
        losses[1200 - 1] = float("inf")
        line = mp.summarize(1, rows(losses))
        self.assertIn("ref(median 5001-6000) nan, first step after 1000 with loss > 10 ref: 1200,", line)
        self.assertIn("mean of last 100 steps 0.002,", line)
        self.assertIn("first step after 1000 with loss > 10 ref: None,", mp.summarize(1, rows([0.002] * 2000)))

    def test_infinity_reads_as_inf_and_nan_as_nan(self):
        # keel's reading of "Infinity" (the shell version's summary read every string as NaN).
        self.assertIn("final loss inf, mean of last 100 steps inf,", mp.summarize(1, rows([0.002] * 1999 + [float("inf")])))
        self.assertIn("final loss nan, mean of last 100 steps nan,", mp.summarize(1, rows([0.002] * 1999 + [float("nan")])))

    def test_loss_every10_csv_keeps_the_loss_as_written(self):
        losses = [0.5] * 30
        losses[19] = float("nan")
        self.assertEqual(mp.loss_every10_csv(rows(losses)), "step,loss,scheme\n10,0.5,mxfp8_e4m3\n20,NaN,mxfp8_e4m3\n30,0.5,mxfp8_e4m3\n")


class MainTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "out")
        self.root = os.path.join(self.dir.name, "policy")
        self.fake = write_fake_trainer(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def main(self, keel_train, seeds):
        env = {"KEEL_TRAIN": keel_train, "POLICY_CONFIG": "p.yaml", "FAKE_STEPS": "2000", "FAKE_BLOWUPS": "2:1500"}
        out, err = io.StringIO(), io.StringIO()
        with mock.patch.dict(os.environ, env), mock.patch.object(mp, "RUN_ROOT", self.root), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = mp.main([self.out] + seeds)
        return rc, out.getvalue(), err.getvalue()

    def read(self, name):
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    def test_every_seed_summarized_and_stale_events_gone(self):
        os.makedirs(os.path.join(self.root, "s1"))
        with open(os.path.join(self.root, "s1", "events.jsonl"), "w") as f:
            f.write(json.dumps({"step": 5, "kind": "stale"}) + "\n")
        os.makedirs(os.path.join(self.root, "s2"))
        rc, out, err = self.main(self.fake, ["2", "1"])
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.splitlines(), [self.read("s1.summary.txt").strip(), self.read("s2.summary.txt").strip()])
        self.assertIn("seed 2: 2000 metric lines, final step 2000, final loss 1,", out)
        self.assertIn("first step after 1000 with loss > 10 ref: None, final scheme mxfp8_e4m3", out)  # no ref: no window
        self.assertEqual(self.read("s1.events.jsonl"), "(no events)\n")
        self.assertEqual(self.read("s2.loss_every10.csv").splitlines()[:2], ["step,loss,scheme", "10,0.002,mxfp8_e4m3"])
        self.assertEqual(len(self.read("s2.loss_every10.csv").splitlines()), 201)
        self.assertEqual(self.read("s1.log"), "")

    def test_events_are_copied(self):
        events = '{"step": 7, "kind": "rollback"}\n'
        fake = os.path.join(self.dir.name, "with-events")
        with open(fake, "w") as f:
            f.write(f'#!/bin/sh\nwhile [ "$1" != --run-dir ]; do shift; done\nmkdir -p "$2"\n'
                    f"printf '%s\\n' '{events.strip()}' > \"$2/events.jsonl\"\n"
                    f"printf '%s\\n' '{{\"step\": 1, \"loss\": 0.5, \"scheme\": \"bf16\"}}' > \"$2/metrics.jsonl\"\n")
        os.chmod(fake, 0o755)
        rc, out, _ = self.main(fake, ["3"])
        self.assertEqual(rc, 0)
        self.assertEqual(self.read("s3.events.jsonl"), events)
        self.assertEqual(out, "seed 3: 1 metric lines, final step 1, final loss 0.5, mean of last 100 steps 0.5, "
                              "ref(median 5001-6000) nan, first step after 1000 with loss > 10 ref: None, final scheme bf16\n")

    def test_a_run_without_metrics_fails_the_call_after_the_others(self):
        rc, out, err = self.main("/bin/true", ["4"])
        self.assertEqual(rc, 1)
        self.assertIn(f"seed 4: no metric lines in {self.root}/s4/metrics.jsonl (see {self.out}/s4.log)", err)
        self.assertEqual(out, self.read("s4.summary.txt"))

    def test_missing_keel_train(self):
        rc, _, err = self.main(os.path.join(self.dir.name, "nope"), ["1"])
        self.assertEqual(rc, 1)
        self.assertIn("(build with scripts/dist)", err)
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    unittest.main()
