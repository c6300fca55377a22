"""Tests of mx_instability.py: the command line, the runs it plans, the trainer pool, and a whole
run against a stand-in keel-train (synthetic.FAKE_TRAINER)."""
import contextlib
import io
import os
import tempfile
import time
import unittest
from unittest import mock

from repro import mx_instability as mi
from repro.criteria import PlanEntry
from repro.runs import read_manifest
from repro.synthetic import write_fake_trainer


def parse_error(argv):
    """(exit status, stderr) of parse_args(argv), which must fail."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            mi.parse_args(argv)
    except SystemExit as e:
        return e.code, err.getvalue()
    raise AssertionError(f"parse_args({argv}) accepted")


class ArgumentsTest(unittest.TestCase):
    def test_defaults(self):
        a = mi.parse_args(["out"])
        self.assertEqual((a.out_dir, a.work, a.seeds, a.jobs, a.steps, a.grid, a.grid_seeds, a.interventions, a.analyze_only, a.clean),
                         ("out", None, [1337, 1, 2, 3, 4, 5], 9, 9000, False, [1337, 1], True, False, False))

    def test_options_before_and_after_out_dir(self):
        a = mi.parse_args(["--seeds", "1337 5", "out", "--work", "/w", "--grid", "--grid-seeds", "7", "--jobs", "2",
                           "--steps", "100", "--no-interventions", "--analyze-only", "--clean"])
        self.assertEqual((a.out_dir, a.work, a.seeds, a.grid_seeds, a.jobs, a.steps, a.grid, a.interventions, a.analyze_only, a.clean),
                         ("out", "/w", [1337, 5], [7], 2, 100, True, False, True, True))

    def test_bad_numbers_name_flag_value_and_what_is_allowed(self):
        for flag, value in (("--jobs", "0"), ("--jobs", "two"), ("--steps", "-5"), ("--steps", "1.5")):
            code, err = parse_error(["out", flag, value])
            self.assertEqual(code, 2)
            self.assertIn(f"argument {flag}: '{value}' is not an integer >= 1", err)

    def test_bad_seeds_name_flag_value_and_what_is_allowed(self):
        for flag in ("--seeds", "--grid-seeds"):
            self.assertIn(f"argument {flag}: '1 x': seed 'x' is not an integer >= 0", parse_error(["out", flag, "1 x"])[1])
            self.assertIn(f"argument {flag}: '-1': seed '-1' is not an integer >= 0", parse_error(["out", flag, "-1"])[1])
            self.assertIn(f"argument {flag}: '5 5': seed 5 appears twice (want each seed once)", parse_error(["out", flag, "5 5"])[1])
            self.assertIn(f"argument {flag}: ' ': no seed", parse_error(["out", flag, " "])[1])

    def test_out_dir_once_and_no_unknown_or_abbreviated_options(self):
        self.assertIn("required: OUT_DIR", parse_error([])[1])
        self.assertIn("unrecognized arguments: b", parse_error(["a", "b"])[1])
        self.assertIn("unrecognized arguments: --cle", parse_error(["a", "--cle"])[1])
        self.assertIn("unrecognized arguments: --bogus", parse_error(["a", "--bogus"])[1])

    def test_help_names_every_option_and_its_default(self):
        text = mi.build_parser().format_help()
        for option in ("--work DIR", "--seeds", "--jobs N", "--steps N", "--grid ", "--grid-seeds", "--no-interventions",
                       "--analyze-only", "--clean", "KEEL_TRAIN", "CONFIG", "PYTHON"):
            self.assertIn(option, text)
        for default in ('(default "1337 1 2 3 4 5")', "(default 9;", "(default 9000", '(default "1337 1")'):
            self.assertIn(default, " ".join(text.split()))


class PlannedRunsTest(unittest.TestCase):
    def test_baselines_mx_first_with_their_settings(self):
        runs = mi.baseline_runs(mi.parse_args(["o", "--seeds", "1 2", "--grid", "--grid-seeds", "7"]), 500)
        self.assertEqual([e.id for e, _ in runs][:4], ["canon-mxfp8_e4m3-s1", "canon-mxfp8_e4m3-s2",
                                                       "L6-lr1e-3-mxfp8_e4m3-s7", "L8-lr1e-3-mxfp8_e4m3-s7"])
        self.assertEqual(len(runs), 12)
        entry, argv = runs[2]
        self.assertEqual((entry.kind, entry.tag, entry.seed, entry.prec, entry.resume), ("baseline", "L6-lr1e-3", 7, "mxfp8_e4m3", None))
        self.assertEqual(" ".join(argv), "--set seed=7 --set precision=mxfp8_e4m3 --set model.layers=6 --set optimizer.lr=1e-3 "
                                         "--set probe_every=50 --set checkpoint_every=500 --set keep_checkpoints=0 --steps 500")
        fp32 = dict((e.id, a) for e, a in runs)["canon-fp32-s2"]
        self.assertIn("probe_every=0", fp32)

    def test_regen_only_when_the_resume_step_has_no_baseline_checkpoint(self):
        entry, argv, ck = mi.regen_run(PlanEntry("canon", 5, 8474, 8000, 8000), "/w")
        self.assertEqual((entry, argv, ck), (None, None, "/w/canon-mxfp8_e4m3-s5/checkpoints/step_00008000"))
        entry, argv, ck = mi.regen_run(PlanEntry("canon", 1337, 7229, 6800, 6500), "/w")
        self.assertEqual((entry.id, entry.kind, entry.prec, entry.resume), ("canon-s1337-regen", "regen", "mxfp8_e4m3", 6500))
        self.assertEqual(argv[-4:], ["--steps", "6800", "--resume", "/w/canon-mxfp8_e4m3-s1337/checkpoints/step_00006500"])
        self.assertEqual(ck, "/w/canon-s1337-regen/checkpoints/step_00006800")

    def test_control_and_six_interventions(self):
        runs = mi.resumed_runs(PlanEntry("canon", 5, 8474, 8000, 8000), "/ck", 9000)
        self.assertEqual([e.id for e, _ in runs], ["canon-s5-control"] + [f"canon-s5-iv-{n}" for n in mi.INTERVENTION_NAMES])
        self.assertTrue(all(e.resume == 8000 for e, _ in runs))
        control, fp32 = runs[0][1], runs[1][1]
        self.assertNotIn("--switch-precision", control)
        self.assertEqual(fp32[len(control):], ["--set", "precision=fp32", "--switch-precision"])
        self.assertEqual(control[-4:], ["--steps", "9000", "--resume", "/ck"])


class TrainerTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.work = self.dir.name
        self.fake = write_fake_trainer(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def trainer(self, jobs=2, **env):
        return mi.Trainer(self.fake, "cfg.yaml", self.work, jobs, dict(os.environ, **env))

    def read(self, run_id, name):
        with open(os.path.join(self.work, run_id, name)) as f:
            return f.read()

    def test_runs_record_command_rc_and_done_and_are_skipped_once_done(self):
        t = self.trainer()
        with contextlib.redirect_stderr(io.StringIO()):
            t.launch("a", ["--set", "seed=1", "--steps", "5"])
            t.launch("b", ["--set", "seed=1", "--bogus"])  # the fake fails on a flag without a value
            t.wait()
            t.launch("a", ["--set", "seed=1", "--steps", "5"])
        self.assertEqual(t.running, [])
        # The space at the end is the shell version's (a fresh start has no "--resume latest").
        self.assertEqual(self.read("a", "command.txt"),
                         f"{self.fake} --config cfg.yaml --run-dir {self.work}/a --quiet --set seed=1 --steps 5 \n")
        self.assertEqual((self.read("a", "rc"), self.read("b", "rc")), ("0\n", "1\n"))
        self.assertTrue(os.path.exists(os.path.join(self.work, "a", "DONE")))
        self.assertFalse(os.path.exists(os.path.join(self.work, "b", "DONE")))
        self.assertEqual(len(self.read("a", "metrics.jsonl").splitlines()), 5)

    def test_an_interrupted_run_continues_from_its_checkpoint_and_a_failed_one_starts_over(self):
        for run_id in ("kept", "fresh"):
            os.makedirs(os.path.join(self.work, run_id))
            with open(os.path.join(self.work, run_id, "metrics.jsonl"), "w") as f:
                f.write("old\n")
        t = self.trainer()
        with contextlib.redirect_stderr(io.StringIO()):
            t.launch("kept", ["--set", "seed=1", "--set", "checkpoint_every=2", "--steps", "4"])
            t.wait()
        os.remove(os.path.join(self.work, "kept", "DONE"))
        with contextlib.redirect_stderr(io.StringIO()) as err:
            t.launch("kept", ["--set", "seed=1", "--steps", "6"])
            t.launch("fresh", ["--set", "seed=1", "--steps", "3"])
            t.wait()
        self.assertIn("kept: continuing from its newest checkpoint", err.getvalue())
        self.assertTrue(self.read("kept", "command.txt").splitlines()[1].endswith("--steps 6 --resume latest"))
        self.assertEqual([l[:11] for l in self.read("kept", "metrics.jsonl").splitlines()][-3:],
                         ['{"step": 4,', '{"step": 5,', '{"step": 6,'])
        self.assertEqual(len(self.read("fresh", "metrics.jsonl").splitlines()), 3)  # the old line is gone

    def test_a_run_killed_by_a_signal_records_the_shell_status(self):
        killed = os.path.join(self.dir.name, "killed")
        with open(killed, "w") as f:
            f.write("#!/bin/sh\nkill -KILL $$\n")
        os.chmod(killed, 0o755)
        t = mi.Trainer(killed, "cfg.yaml", self.work, 1, dict(os.environ))
        with contextlib.redirect_stderr(io.StringIO()) as err:
            t.launch("k", ["--steps", "1"])
            t.wait()
        self.assertEqual(self.read("k", "rc"), "137\n")  # 128 + SIGKILL, not Popen's -9
        self.assertIn("k: rc 137,", err.getvalue())
        self.assertFalse(os.path.exists(os.path.join(self.work, "k", "DONE")))

    def test_at_most_jobs_at_once(self):
        t = self.trainer(jobs=2, FAKE_SLEEP="0.3")
        most = 0
        with contextlib.redirect_stderr(io.StringIO()):
            for i in range(5):
                t.launch(f"r{i}", ["--set", "seed=1", "--steps", "1"])
                most = max(most, len(t.running))
            t.wait()
        self.assertEqual(most, 2)
        self.assertTrue(all(self.read(f"r{i}", "rc") == "0\n" for i in range(5)))

    def test_stop_ends_every_run_without_marking_it(self):
        t = self.trainer(jobs=3, FAKE_SLEEP="60")
        start = time.monotonic()
        with contextlib.redirect_stderr(io.StringIO()) as err:
            for i in range(2):
                t.launch(f"r{i}", ["--set", "seed=1", "--steps", "1"])
            t.stop()
        self.assertLess(time.monotonic() - start, 30)
        self.assertEqual(t.running, [])
        self.assertIn("r1: stopped", err.getvalue())
        self.assertFalse(os.path.exists(os.path.join(self.work, "r0", "rc")))
        self.assertFalse(os.path.exists(os.path.join(self.work, "r0", "DONE")))


class SetupFilesTest(unittest.TestCase):
    def test_failed_command_output_kept_or_replaced_and_missing_command(self):
        failing = ["sh", "-c", "echo driver gone; echo noise >&2; exit 9"]
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "f.txt")
            mi._write_output(path, failing, dict(os.environ), "no nvidia-smi\n", keep_failed_output=True)
            self.assertEqual(open(path).read(), "driver gone\nno nvidia-smi\n")
            mi._write_output(path, failing, dict(os.environ), "unknown\n", keep_failed_output=False)
            self.assertEqual(open(path).read(), "unknown\n")
            mi._write_output(path, [os.path.join(d, "absent")], dict(os.environ), "no nvidia-smi\n", keep_failed_output=True)
            self.assertEqual(open(path).read(), "no nvidia-smi\n")
            mi._write_output(path, ["sh", "-c", "echo abc"], dict(os.environ), "unknown\n", keep_failed_output=False)
            self.assertEqual(open(path).read(), "abc\n")


class MainTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.out = os.path.join(self.dir.name, "out")
        self.work = os.path.join(self.dir.name, "work")
        self.fake = write_fake_trainer(self.dir.name)

    def tearDown(self):
        self.dir.cleanup()

    def main(self, *argv, keel_train=None):
        env = {"KEEL_TRAIN": keel_train or self.fake, "CONFIG": "cfg.yaml", "FAKE_BLOWUPS": "1:6650"}
        err = io.StringIO()
        with mock.patch.dict(os.environ, env), contextlib.redirect_stderr(err):
            rc = mi.main([self.out, "--work", self.work, "--steps", "7000", "--seeds", "1 2", "--jobs", "4"] + list(argv))
        return rc, err.getvalue()

    def read(self, *path):
        with open(os.path.join(*path)) as f:
            return f.read()

    def test_whole_run_then_rerun_then_clean(self):
        rc, err = self.main()
        self.assertEqual(rc, 0, err)
        # Seed 1's MX baseline blows up at 6650: C = 6200, regenerated from the checkpoint at 6000.
        self.assertIn("diverged MX baselines (tag seed blow-up C P): canon 1 6650 6200 6000", err)
        manifest = read_manifest(os.path.join(self.out, "manifest.tsv"))
        self.assertEqual(len(manifest), 6 + 1 + 1 + 6)
        self.assertEqual(manifest[6].id, "canon-s1-regen")
        commands = self.read(self.out, "commands.txt").splitlines()
        self.assertEqual(len(commands), 14)
        self.assertTrue(all(" rc=0: " in line for line in commands))
        self.assertEqual(self.read(self.out, "presets.txt"), "fake presets\n")
        for name in ("device.txt", "commit.txt", "baselines.csv", "interventions.csv", "bitexact.csv"):
            self.assertTrue(os.path.exists(os.path.join(self.out, name)), name)
        summary = self.read(self.out, "summary.md")
        self.assertIn("| canon | 1 | mxfp8_e4m3 | 7000 | 0.002 | 6650 |", summary)
        self.assertIn("| canon | 1 | control | 6200 | 6650 (450) | 6650 | 0 |", summary)
        self.assertIn("| canon | 1 | control | 6201..7000 | 800 | 800 | none |", summary)
        self.assertIn("| canon | 1 | regen | 6001..6200 | 200 | 200 | none |", summary)
        self.assertIn("| canon | 1 | fp32 | 6200 | 6650 (450) | none | - |", summary)
        # A second call finds every run done: nothing runs again, the report is the same.
        rc, err = self.main()
        self.assertEqual(rc, 0, err)
        self.assertNotIn(": rc ", err)
        self.assertEqual(self.read(self.out, "summary.md"), summary)
        self.assertEqual(len(self.read(self.work, "canon-mxfp8_e4m3-s1", "command.txt").splitlines()), 1)
        self.assertTrue(os.path.isdir(os.path.join(self.work, "canon-mxfp8_e4m3-s1", "checkpoints")))
        rc, _ = self.main("--analyze-only", "--clean")
        self.assertEqual(rc, 0)
        self.assertFalse(os.path.exists(os.path.join(self.work, "canon-mxfp8_e4m3-s1", "checkpoints")))
        self.assertEqual(self.read(self.out, "summary.md"), summary)

    def test_no_interventions(self):
        rc, err = self.main("--no-interventions")
        self.assertEqual(rc, 0, err)
        self.assertEqual(len(read_manifest(os.path.join(self.out, "manifest.tsv"))), 6)
        self.assertNotIn("diverged", err)
        self.assertFalse(os.path.exists(os.path.join(self.out, "interventions.csv")))

    def test_missing_keel_train(self):
        rc, err = self.main(keel_train=os.path.join(self.dir.name, "nope"))
        self.assertEqual(rc, 1)
        self.assertIn(f"no {self.dir.name}/nope (build with scripts/dist)", err)
        self.assertFalse(os.path.exists(os.path.join(self.work, "manifest.tsv")))


if __name__ == "__main__":
    unittest.main()
