"""Tests of demo_results.py: the newest sweep's id and the rescue count, from keel's JSON."""
import io
import json
import unittest

import demo_results as dr


def run(state, loss, policy_interventions):
    return {"id": "r", "state": state, "loss": loss, "axes": {"policy.max_interventions": policy_interventions, "seed": "1"}}


def call(argv, doc):
    out, err = io.StringIO(), io.StringIO()
    rc = dr.main(argv, io.StringIO(doc if isinstance(doc, str) else json.dumps(doc)), out, err)
    return rc, out.getvalue(), err.getvalue()


class LastSweepTest(unittest.TestCase):
    def test_the_last_listed_sweep(self):
        self.assertEqual(call(["last-sweep"], {"sweeps": [{"id": "s-1"}, {"id": "s-2"}], "next_page_token": ""}), (0, "s-2\n", ""))

    def test_no_sweep_is_an_error(self):
        rc, out, err = call(["last-sweep"], {"sweeps": []})
        self.assertEqual((rc, out), (1, ""))
        self.assertIn("sweeps: the list is empty", err)


class RescueTest(unittest.TestCase):
    RUNS = [run("SUCCEEDED", 0.01, "0"),        # policy off, healthy
            run("DIVERGED", 5.0, "0"),          # policy off, blew up
            run("SUCCEEDED", 0.5, "0"),         # policy off, finished above 0.1
            run("SUCCEEDED", "NaN", "0"),       # policy off, NaN loss: not healthy
            run("SUCCEEDED", 0.02, "3"),        # policy on, rescued
            run("SUCCEEDED", 0.0999, "3"),      # policy on, rescued
            run("FAILED", 0.01, "3"),           # policy on, failed: not healthy whatever the loss
            run("SUCCEEDED", "Infinity", "3")]  # policy on, not healthy

    def test_counts(self):
        rc, out, err = call(["rescue"], {"runs": self.RUNS})
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out.split("\n"), [
            "",
            "policy off: 3 of 4 runs blew up at the step-150 fault (final loss > 0.1)",
            "policy on:  2 of 4 runs were caught, rolled back, moved up the ladder and finished healthy (loss < 0.1)",
            ""])

    def test_a_run_without_the_axis_counts_as_policy_on(self):
        lines = dr.rescue_lines({"runs": [{"state": "SUCCEEDED", "loss": 0.01, "axes": {}}]})
        self.assertEqual(lines[1:], ["policy off: 0 of 0 runs blew up at the step-150 fault (final loss > 0.1)",
                                     "policy on:  1 of 1 runs were caught, rolled back, moved up the ladder and finished healthy (loss < 0.1)"])

    def test_run_loss(self):
        self.assertEqual([dr.run_loss({"loss": v}) for v in (0.5, 2, "Infinity", "-Infinity")], [0.5, 2.0, float("inf"), float("-inf")])
        for v in ("NaN", None, "x", True):
            self.assertNotEqual(dr.run_loss({"loss": v}), dr.run_loss({"loss": v}))  # NaN
        self.assertNotEqual(dr.run_loss({}), dr.run_loss({}))


class MainTest(unittest.TestCase):
    def test_usage(self):
        for argv in ([], ["bogus"], ["rescue", "x"]):
            rc, _, err = call(argv, "{}")
            self.assertEqual(rc, 2)
            self.assertIn("usage: demo_results.py last-sweep|rescue", err)

    def test_bad_json_and_missing_fields_name_the_problem(self):
        rc, _, err = call(["rescue"], "not json")
        self.assertEqual(rc, 1)
        self.assertIn("demo_results.py rescue: cannot read keel's JSON on stdin", err)
        rc, _, err = call(["last-sweep"], {"sweeps": [{"name": "no id"}]})
        self.assertEqual((rc, err), (1, "demo_results.py last-sweep: keel's JSON on stdin has no field 'id'\n"))


if __name__ == "__main__":
    unittest.main()
