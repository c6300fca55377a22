"""Tests of scripts/policy-grid's own arithmetic, on synthetic runs (the whole path through keeld
and keel-worker is policy_grid_e2e_test.sh): the blow-up rule, a run directory's summary
(replays, events, the language model's ratio), the pairing of policy runs with their unprotected
twins and references (caught, warning, rescued, false alarms, extra compute), the report's lines,
and the sweep files `gen` writes."""
import contextlib
import gzip
import importlib.machinery
import importlib.util
import io
import json
import lzma
import math
import os
import sys
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader("policy_grid", os.path.join(_HERE, "policy-grid"))
_spec = importlib.util.spec_from_loader("policy_grid", _loader)
pg = importlib.util.module_from_spec(_spec)
_loader.exec_module(pg)


def summary(variant, fmt, seed, **kw):
    """A run's summary as `run` writes it, for a (layers 4, width 256, lr 1e-3) grid of 1000 steps."""
    start = kw.pop("start_scheme", fmt)
    s = {"id": f"{variant}-{fmt}-{seed}", "state": "SUCCEEDED", "variant": variant, "layers": 4, "width": 256,
         "lr": 1e-3, "seed": seed, "format": fmt, "steps": 1000, "restarts": 0, "message": "", "rows": 1000,
         "last_step": 1000, "final_loss": 1.0, "language_model": False, "blowup_step": None, "wall_s": 100.0,
         "step_ms_median": 10.0, "start_scheme": start, "final_scheme": start, "rows_per_scheme": {start: 1000},
         "events": [], "first_action_step": None, "_source": "grid"}
    s.update(kw)
    return s


def grid(reference="fp32"):
    """Three seeds of mxfp8_e4m3: seed 1 blows up at 500 unprotected and the policy catches it at 480
    (a rollback to 460 abandons 20 steps, which metrics.jsonl no longer holds, and 540 steps run in
    the reference scheme) and finishes at 1.0; seed 2
    never blows up but the policy acts at 300 (a false alarm); seed 3 is healthy and untouched."""
    ref = [summary("fp32", reference, seed, final_loss=0.95, step_ms_median=20.0) for seed in (1, 2, 3)]
    return ref + [
        summary("plain", "mxfp8_e4m3", 1, blowup_step=500, final_loss=None),
        summary("default", "mxfp8_e4m3", 1, first_action_step=480,
                rows_per_scheme={"mxfp8_e4m3": 460, reference: 540}, final_scheme=reference,
                events=[{"step": 460, "kind": "rollback", "message": "rolled back from step 480 to 460: rule blow-up"},
                        {"step": 460, "kind": "switch_precision", "message": ""}]),
        summary("plain", "mxfp8_e4m3", 2, final_loss=0.97),
        summary("default", "mxfp8_e4m3", 2, first_action_step=300, final_loss=0.96,
                events=[{"step": 300, "kind": "scale_lr", "message": ""}]),
        summary("plain", "mxfp8_e4m3", 3, final_loss=0.97),
        summary("default", "mxfp8_e4m3", 3, final_loss=0.97),
    ]


def has_all(test, text, *lines):
    for line in lines:
        test.assertIn(line, text)


def report_text(runs, lm_rule="paired", policy="default"):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "grid-runs.jsonl")
        with open(path, "w") as f:
            for r in runs:
                f.write(json.dumps({k: v for k, v in r.items() if k != "_source"}) + "\n")
        out = os.path.join(d, "report.md")
        with contextlib.redirect_stdout(io.StringIO()):
            pg.report(type("Args", (), {"runs": [path], "series": [], "o": out, "lm_rule": lm_rule,
                                        "policy": policy})())
        with open(out) as f:
            return f.read()


class BlowupTest(unittest.TestCase):
    def test_warmup_is_ignored_then_ratio_or_non_finite_counts(self):
        rows = [{"step": s, "loss": 10.0 / s} for s in range(1, 101)]  # 10, 5, 3.3, ... 0.1
        rows[2]["loss"] = 1e9        # step 3: within the warm-up (5% of 100 steps)
        rows[1]["loss"] = math.nan   # step 2: likewise
        self.assertIsNone(pg.blowup_step(rows, 100))
        spiked = [dict(r) for r in rows]
        spiked[59]["loss"] = 10.0 * (10.0 / 59) + 0.01  # step 60: just above 10x the lowest so far
        self.assertEqual(pg.blowup_step(spiked, 100), 60)
        self.assertIsNone(pg.blowup_step(spiked[:59] + [dict(spiked[59], loss=9.9 * 10.0 / 59)], 100))
        nan = [dict(r) for r in rows]
        nan[79]["loss"] = math.inf
        self.assertEqual(pg.blowup_step(nan, 100), 80)
        # A language model's ratio is 1.5: a rise to 1.6x the lowest blows up.
        lm = [{"step": s, "loss": 3.0} for s in range(1, 101)]
        lm[49]["loss"] = 4.9
        self.assertEqual(pg.blowup_step(lm, 100, pg.LM_BLOWUP_RATIO), 50)
        self.assertIsNone(pg.blowup_step(lm, 100))


class SummarizeTest(unittest.TestCase):
    def test_replays_events_and_the_language_models_ratio(self):
        with tempfile.TemporaryDirectory() as d:
            rows = [{"step": s, "loss": 3.0, "scheme": "mxfp8_e4m3", "step_ms": 10.0, "unix_ms": 1000 * s}
                    for s in range(1, 41)]
            rows[29]["loss"] = 5.0  # step 30: 1.67x, a language model's blow-up
            # A rollback from step 30 to 25 drops the lines after 25, as the trainer does; then steps
            # 26..40 again in bf16.
            rows = rows[:25] + [{"step": s, "loss": 3.0, "scheme": "bf16", "step_ms": 20.0,
                                 "unix_ms": 1000 * (s + 5)} for s in range(26, 41)]
            with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
            with open(os.path.join(d, "run.yaml"), "w") as f:
                f.write("model: {type: gpt, layers: 2, vocab: 64, padded_vocab: 128}\n")
            with open(os.path.join(d, "events.jsonl"), "w") as f:
                f.write(json.dumps({"step": 25, "kind": "rollback",
                                    "message": "rolled back from step 30 to 25: rule blow-up (spike)",
                                    "details": {"from_step": "30", "to_step": "25", "checkpoint": "x"}}) + "\n")
                f.write(json.dumps({"step": 25, "kind": "switch_precision", "message": "mxfp8_e4m3 -> bf16"}) + "\n")
            run = {"id": "run-7", "state": "SUCCEEDED", "steps": 40,
                   "axes": {"model.layers": "2", "model.width": "64", "optimizer.lr": "0.001", "seed": "1",
                            "precision": "mxfp8_e4m3", "policy": "default"}}
            s, series = pg.summarize(run, d)
        self.assertEqual(s["variant"], "default")
        self.assertTrue(s["language_model"])
        self.assertEqual(s["rows"], 40)
        self.assertEqual(s["rows_per_scheme"], {"mxfp8_e4m3": 25, "bf16": 15})
        self.assertEqual(s["step_ms_by_scheme"], {"mxfp8_e4m3": 10.0, "bf16": 20.0})
        # The 5 abandoned steps are in no row: the rollback's event counts them.
        self.assertEqual(s["replayed_steps"], 5)
        # The kept timeline has the replayed steps, so the spike at 30 is gone.
        self.assertIsNone(s["blowup_step"])
        self.assertEqual(s["first_action_step"], 30)  # the rollback's firing step, from its message
        self.assertEqual((s["start_scheme"], s["final_scheme"]), ("mxfp8_e4m3", "bf16"))
        self.assertEqual(s["last_step"], 40)
        self.assertEqual(len(series[1]), 40)
        # What the paired rule needs: the vocabulary (not padded_vocab) and 10-step means of the
        # kept timeline (steps 21..30 were replayed at 3.0, so the spike is gone there too).
        self.assertEqual(s["vocab"], 64)
        self.assertEqual(s["loss_windows"], [[10, 3.0], [20, 3.0], [30, 3.0], [40, 3.0]])


class AnalyseTest(unittest.TestCase):
    def test_caught_rescued_false_alarm_and_extra_compute(self):
        rows = {r["seed"]: r for r in pg.analyse(grid())}
        self.assertEqual(sorted(rows), [1, 2, 3])
        one, two, three = rows[1], rows[2], rows[3]
        self.assertTrue(one["blew"] and one["caught"] and one["rescued"])
        self.assertEqual(one["warning"], 20)
        self.assertEqual((one["level"], one["level_from"]), (0.95, "fp32"))
        # 20 replayed steps (from the rollback's message: the summary has no replayed_steps), and 540
        # in a scheme that costs 2x: (20 + 540 x (2 - 1)) / 1000.
        self.assertAlmostEqual(one["extra"], 0.56)
        self.assertTrue(two["false_alarm"] and not two["blew"])
        self.assertEqual(two["extra"], 0.0)
        self.assertFalse(three["acted"] or three["false_alarm"] or three["blew"])

    def test_a_bf16_head_rung_never_run_whole_costs_its_base_schemes(self):
        # Seed 1's policy run spends 520 steps in mxfp8_e4m3+bf16_head, which no run ran whole:
        # charged at mxfp8_e4m3's cost (10 ms, the starting scheme's), so only the 20 replayed steps count.
        runs = grid()
        for r in runs:
            if r["variant"] == "default" and r["seed"] == 1:
                r["rows_per_scheme"] = {"mxfp8_e4m3": 500, "mxfp8_e4m3+bf16_head": 520}
        one = [r for r in pg.analyse(runs) if r["seed"] == 1][0]
        self.assertAlmostEqual(one["extra"], 0.02)

    def test_a_runs_own_step_times_price_its_switch_before_the_cells_medians(self):
        # The cell's runs say the reference scheme costs 2x (20 ms against 10), but seed 1's policy run
        # took 12 ms a step in it against its own 10 in mxfp8_e4m3 (neighbours on its GPU left): its 540
        # steps there cost 0.2 each, plus the 20 replayed: (20 + 540 x 0.2) / 1000.
        runs = grid()
        for r in runs:
            if r["variant"] == "default" and r["seed"] == 1:
                r["step_ms_by_scheme"] = {"mxfp8_e4m3": 10.0, "fp32": 12.0}
        one = [r for r in pg.analyse(runs) if r["seed"] == 1][0]
        self.assertAlmostEqual(one["extra"], 0.128)
        # A summary without the per-scheme times (before session 34) keeps the cell's medians: 0.56.
        self.assertAlmostEqual([r for r in pg.analyse(grid()) if r["seed"] == 1][0]["extra"], 0.56)

    def test_the_rollback_variant_is_compared_with_the_default_pair_by_pair(self):
        # Seed 1 again with policy: {preset: default, rollback: 200}: its rollback goes 200 steps back
        # (from 480 to 280) where the default's went 20; both rescued.
        runs = grid()
        short = dict([r for r in runs if r["variant"] == "default" and r["seed"] == 1][0])
        short.update(variant="rollback", id="rollback-1",
                     events=[{"step": 280, "kind": "rollback", "message": "rolled back from step 480 to 280: x"},
                             {"step": 280, "kind": "switch_precision", "message": ""}],
                     rows_per_scheme={"mxfp8_e4m3": 280, "fp32": 720})
        text = report_text(runs + [short])
        has_all(self, text, "## Rollback distance: policy: default against `{preset: default, rollback: N}`",
                "- without rollback: rescued 1/1 (100%), false alarms 0/1 (0%), steps above the starting scheme 540, "
                "replayed steps 20, extra compute mean 56.0%",
                "- with rollback: rescued 1/1 (100%), false alarms 0/1 (0%), steps above the starting scheme 720, "
                "replayed steps 200, extra compute mean 92.0%",
                "| mxfp8_e4m3 | 4 | 256 | 0.001 | 1 | rescued, 1, fp32, 540, 20 | rescued, 1, fp32, 720, 200 |")
        self.assertNotIn("## Probation", text)
        self.assertNotIn("## Learning-rate fallbacks", text)
        # The same pair with policy: {preset: default, lr_fallbacks: 2}: its own section.
        halved = dict(short, variant="lr_fallbacks", id="lr-fallbacks-1")
        text = report_text(runs + [halved])
        has_all(self, text, "## Learning-rate fallbacks: policy: default against `{preset: default, lr_fallbacks: N}`",
                "- with lr_fallbacks: rescued 1/1 (100%)")
        self.assertNotIn("## Rollback distance", text)

    def test_report_policy_makes_a_combined_variant_the_policy_the_tables_are_about(self):
        # A sweep whose policy runs are all {preset: default, rollback: 200, lr_fallbacks: 3}: the
        # default report has no pair (and no empty section); --policy rollback+lr_fallbacks judges them,
        # and compares any other variant of the same sweep with them.
        runs = grid()
        for r in runs:
            if r["variant"] == "default":
                r["variant"] = "rollback+lr_fallbacks"
        text = report_text(runs)
        self.assertIn("- configurations x seeds with a policy run and its unprotected twin: 0", text)
        self.assertNotIn("## Variants", text)
        text = report_text(runs, policy="rollback+lr_fallbacks")
        has_all(self, text, "- the policy runs: the variant `rollback+lr_fallbacks` (scripts/policy-grid report --policy)",
                "- configurations x seeds with a policy run and its unprotected twin: 3",
                "- rescued (finished, final loss <= 1.1x the healthy level): **1/1 (100%)**")
        old = dict([r for r in runs if r["variant"] == "rollback+lr_fallbacks" and r["seed"] == 1][0],
                   variant="default", id="default-1")
        text = report_text(runs + [old], policy="rollback+lr_fallbacks")
        has_all(self, text, "## Variants: `rollback+lr_fallbacks` against `default`",
                "- rollback+lr_fallbacks: rescued 1/1 (100%)", "- default: rescued 1/1 (100%)",
                "| format | L | d | lr | seed | rollback+lr_fallbacks: verdict, final, scheme, steps above, replayed | "
                "default: verdict, final, scheme, steps above, replayed |")

    def test_a_policy_run_pairs_with_the_twin_and_reference_of_its_own_sweep(self):
        # Two sweeps run seed 2 of the same cell with different builds: in the newer one ("later") the
        # unprotected run blows up at 700, its policy run acts at 690 and is rescued; its fp32 run
        # blows up too. The older sweep's seed 2 stays a false alarm against its own twin, and the
        # newer one's is judged against its own (not the other sweep's healthy fp32 run).
        later = [dict(r, _source="later") for r in grid() if r["seed"] == 2]
        for r in later:
            if r["variant"] == "plain":
                r.update(blowup_step=700, final_loss=None)
            elif r["variant"] == "default":
                r.update(first_action_step=690)
            else:
                r.update(blowup_step=650)
        rows = {(r["source"], r["seed"]): r for r in pg.analyse(grid() + later)}
        old, new = rows[("grid", 2)], rows[("later", 2)]
        self.assertTrue(old["false_alarm"] and not old["blew"])
        self.assertTrue(new["blew"] and new["caught"] and new["rescued"] and not new["false_alarm"])
        self.assertEqual(new["warning"], 10)
        self.assertTrue(new["fp32_blew"])
        self.assertEqual(new["level_from"], "median")  # its own reference blew up
        self.assertEqual((old["level"], old["level_from"]), (0.95, "fp32"))

    def test_where_fp32_blew_up_a_run_is_judged_by_its_own_seeds_healthy_runs(self):
        # fp32 blows up in seeds 2 and 3. Seed 1's healthy runs end at 0.95 (fp32) and 1.0 (policy); seed 2's
        # unprotected run ends healthy at 1.2 and its policy run (which acted: a false alarm) at 1.25, so
        # seed 2's level is the median of its own two, 1.225, not of every seed's (1.1): a 1.25 run is
        # within 1.1x of its seed and not of the cell. Seed 3 has no healthy run of its own (its
        # unprotected run blew up, its policy run spiked at 700 and ended at 1.0): the median of the
        # cell's healthy runs at every seed, [0.95, 1.0, 1.2, 1.25] -> 1.1, and it is rescued.
        runs = grid()
        for r in runs:
            if r["variant"] == "fp32" and r["seed"] in (2, 3):
                r.update(blowup_step=650, final_loss=None)
            if r["seed"] == 2 and r["variant"] == "plain":
                r.update(final_loss=1.2)
            if r["seed"] == 2 and r["variant"] == "default":
                r.update(final_loss=1.25)
            if r["seed"] == 3 and r["variant"] == "plain":
                r.update(blowup_step=600, final_loss=None)
            if r["seed"] == 3 and r["variant"] == "default":
                r.update(first_action_step=590, blowup_step=700)
        rows = {r["seed"]: r for r in pg.analyse(runs)}
        self.assertAlmostEqual(rows[2]["level"], 1.225)
        self.assertEqual(rows[2]["level_from"], "median")
        self.assertTrue(rows[2]["false_alarm"] and not rows[2]["stalled"])
        self.assertAlmostEqual(rows[3]["level"], 1.1)
        self.assertEqual(rows[3]["level_from"], "median, all seeds")
        self.assertTrue(rows[3]["blew"] and rows[3]["caught"] and rows[3]["rescued"])

    def test_the_time_outside_the_steps_is_wall_minus_steps_and_is_reported(self):
        # Seed 2's policy run took 21 s for 1000 steps of 10 ms (11 s outside them: snapshots on disk),
        # its twin 15 s (5 s outside): 6 s more, 60% of the twin's 10 s in steps.
        runs = grid()
        for r in runs:
            if r["seed"] == 2 and r["variant"] in ("default", "plain"):
                r["wall_s"] = 21.0 if r["variant"] == "default" else 15.0
        two = [r for r in pg.analyse(runs) if r["seed"] == 2][0]
        self.assertAlmostEqual(two["outside"], 11.0)
        self.assertAlmostEqual(two["outside_twin"], 5.0)
        self.assertAlmostEqual(two["outside_share"], 0.6)
        has_all(self, report_text(runs), "- time outside the steps (wall time - (steps + replayed steps) x median step time",
                "the difference is mean ")

    def test_per_configuration_gives_the_warning_and_the_compute_the_issue_asks_for(self):
        # The grid's one configuration: 3 pairs, seed 1 blew up and was caught 20 steps ahead and
        # rescued, seed 2 a false alarm; 20 steps replayed and 540 in fp32 (seed 1's), extra compute
        # mean (56% + 0 + 0) / 3.
        has_all(self, report_text(grid()),
                "| format | L | d | lr | runs | blew up | caught | warning (median steps) | rescued | false alarms | "
                "replayed steps | steps above the start | extra compute (mean) |",
                "| mxfp8_e4m3 | 4 | 256 | 0.001 | 3 | 1 | 1 | 20 | 1 | 1 | 20 | 540 | 18.7% |")

    def test_targets_by_learning_rate_and_depth_name_what_each_group_misses(self):
        # grid(): depth 4, lr 1e-3, 3 pairs: the one blow-up rescued, seed 2 a false alarm (1 of 3 runs),
        # extra compute 18.7% on average: it misses the false alarms and the compute, not the rescues. A
        # second group (depth 8) with one healthy untouched pair misses nothing.
        runs = grid() + [summary("plain", "mxfp8_e4m3", 1, layers=8), summary("default", "mxfp8_e4m3", 1, layers=8),
                         summary("fp32", "fp32", 1, layers=8, final_loss=0.95, step_ms_median=20.0)]
        has_all(self, report_text(runs), "## Targets by learning rate and depth",
                "| lr | L | pairs | blew up | rescued | false alarms | extra compute (mean) | misses |",
                "| 0.001 | 4 | 3 | 1 | 1/1 (100%) | 1/3 (33%) | 18.7% | false alarms, extra compute |",
                "| 0.001 | 8 | 1 | 0 | 0/0 | 0/1 (0%) | 0.0% | - |")
        for r in runs:
            if r["variant"] == "default" and r["layers"] == 4 and r["seed"] == 1:
                r["final_loss"] = 2.0  # not rescued: 1 of 1 missed
        self.assertIn("| 0.001 | 4 | 3 | 1 | 0/1 (0%) | 1/3 (33%) |", report_text(runs))

    def test_the_time_outside_the_steps_leaves_out_the_replayed_steps(self):
        # Seed 1's policy run: 1000 steps and the 20 replayed ones at its median 10 ms, 10.2 s in steps,
        # so 9.8 s of its 20 s outside them (9.6 s before session 36, which counted the replays there too).
        runs = grid()
        for r in runs:
            if r["seed"] == 1 and r["variant"] == "default":
                r["wall_s"] = 20.0
            elif r["seed"] == 1 and r["variant"] == "plain":
                r["wall_s"] = 15.0
        one = [r for r in pg.analyse(runs) if r["seed"] == 1][0]
        self.assertEqual(one["replayed"], 20)
        self.assertAlmostEqual(one["outside"], 20.0 - 1020 * 10 / 1000.0)
        self.assertAlmostEqual(one["outside_twin"], 15.0 - 1000 * 10 / 1000.0)

    def write_runs(self, d, name, runs):
        path = os.path.join(d, f"{name}-runs.jsonl")
        with open(path, "w") as f:
            for r in runs:
                f.write(json.dumps({k: v for k, v in r.items() if k != "_source"}) + "\n")
        return path

    def test_a_policy_only_sweep_takes_its_twins_and_references_from_earlier_sweeps(self):
        # "later" ran only grid()'s policy runs (gen --policy-only); "earlier" ran the whole grid with the
        # same build and "again" its seed-1 twin once more, identically. With --twins the policy runs pair
        # as if their sweep had run everything: the same caught, rescued and false alarm; but wall times
        # are not compared across sweeps (other machine, other neighbours).
        later = [dict(r, wall_s=300.0) for r in grid() if r["variant"] == "default"]
        with tempfile.TemporaryDirectory() as d:
            earlier = self.write_runs(d, "earlier", grid())
            again = self.write_runs(d, "again", [r for r in grid() if r["variant"] == "plain" and r["seed"] == 1])
            mine = self.write_runs(d, "later", later)
            runs = pg.adopt_twins(pg.load([mine]), [earlier, again])
            self.assertEqual(sorted((r["variant"], r["seed"]) for r in runs if r.get("_twin_from")),
                             [("fp32", 1), ("fp32", 2), ("fp32", 3), ("plain", 1), ("plain", 2), ("plain", 3)])
            self.assertEqual({r["_source"] for r in runs}, {"later"})
            rows = {r["seed"]: r for r in pg.analyse(runs)}
            self.assertTrue(rows[1]["caught"] and rows[1]["rescued"] and rows[1]["warning"] == 20)
            self.assertTrue(rows[2]["false_alarm"])
            self.assertEqual((rows[1]["level"], rows[1]["level_from"]), (0.95, "fp32"))
            self.assertIsNone(rows[1]["wall_ratio"])
            self.assertIsNone(rows[1]["outside"])
            self.assertEqual(len(pg.analyse(pg.load([mine]))), 0)  # without --twins: no pairs
            out = os.path.join(d, "report.md")
            with contextlib.redirect_stdout(io.StringIO()):
                pg.report(type("Args", (), {"runs": [mine], "series": [], "o": out, "twins": [earlier, again]})())
            with open(out) as f:
                text = f.read()
            has_all(self, text, "- configurations x seeds with a policy run and its unprotected twin: 3",
                    "- unprotected twins and references taken from earlier sweeps of the same build (--twins; "
                    "training is deterministic): 6, from earlier (6)", "**1/1 (100%)**")
            self.assertNotIn("measured wall time", text)
            cov = pg.coverage_text(pg.adopt_twins(pg.load([mine]), [earlier]))
            self.assertIn("**3 of 324**", cov)
            # A sweep of another build whose seed-1 twin ended elsewhere: the report stops and names both.
            other = self.write_runs(d, "other", [dict(r, final_loss=0.5) for r in grid()
                                                  if r["variant"] == "plain" and r["seed"] == 1])
            with self.assertRaises(SystemExit) as e:
                pg.adopt_twins(pg.load([mine]), [earlier, other])
            self.assertIn("the sweeps earlier, other ran plain mxfp8_e4m3 at layers 4, width 256, lr 0.001, seed 1 "
                          "and disagree", str(e.exception))
            # A sweep's own twin wins over a donor's.
            own = pg.adopt_twins(pg.load([mine]) + [dict(grid()[3], _source="later")], [earlier])
            self.assertEqual(sum(1 for r in own if r["variant"] == "plain" and r["seed"] == 1), 1)

    def test_the_start_is_the_runs_format_when_a_rollback_replayed_every_step_in_a_rescue_scheme(self):
        # Seed 1's policy run rolled back to step 0 and ran all 1000 steps in fp32 (twice the cost): its
        # first row's scheme is fp32, but the 1000 steps are above its start (mxfp8_e4m3) and cost 100%.
        runs = grid()
        for r in runs:
            if r["variant"] == "default" and r["seed"] == 1:
                r.update(start_scheme="fp32", rows_per_scheme={"fp32": 1000},
                         step_ms_by_scheme={"fp32": 20.0},
                         events=[{"step": 0, "kind": "rollback", "message": "rolled back from step 20 to 0: rule x"}])
        one = [r for r in pg.analyse(runs) if r["seed"] == 1][0]
        self.assertEqual(one["above"], 1000)
        self.assertAlmostEqual(one["extra"], (20 + 1000 * (20.0 / 10.0 - 1.0)) / 1000)

    def test_coverage_counts_the_pairs_that_ended_in_the_issues_grid(self):
        # grid(): depth 4, width 256, lr 1e-3, mxfp8_e4m3, seeds 1-3, every pair ended: 3 of 324. A cancelled
        # policy run takes its pair out; a run at lr 2e-3 lies outside the grid.
        runs = grid()
        text = pg.coverage_text(runs)
        has_all(self, text, "in the issue's grid: **3 of 324**", "cells (depth, width, lr) touched: 1 of 36; "
                "with 3 seeds of every format: 0", "| depth | width | lr 3e-4 | lr 6e-4 | lr 1e-3 |",
                "| 4 | 256 | - | - | E4M3 seeds 1,2,3 |", "| 8 | 512 | - | - | - |")
        for r in runs:
            if r["variant"] == "default" and r["seed"] == 3:
                r["state"] = "CANCELLED"
        extra = [summary("plain", "mxfp8_e4m3", 1, lr=2e-3), summary("default", "mxfp8_e4m3", 1, lr=2e-3),
                 summary("fp32", "fp32", 1, lr=2e-3)]
        text = pg.coverage_text(runs + extra)
        has_all(self, text, "**2 of 324**", "| 4 | 256 | - | - | E4M3 seeds 1,2 |",
                "pairs outside the grid (other depths, widths, learning rates or formats): 1")

    def test_a_run_above_the_rescue_factor_is_not_rescued(self):
        runs = grid()
        for r in runs:
            if r["variant"] == "default" and r["seed"] == 1:
                r["final_loss"] = 1.1 * 0.95 * 1.01
        one = [r for r in pg.analyse(runs) if r["seed"] == 1][0]
        self.assertTrue(one["caught"])
        self.assertFalse(one["rescued"])

    def test_a_stalled_twin_is_a_false_alarm_that_may_recover(self):
        # Seed 2's unprotected run ends at 1.2 (above 1.1 x 0.95 = 1.045) without blowing up; its
        # policy run acted and ends at 0.96: a false alarm, on a stalled twin, recovered. Seed 3 stalls
        # too and is left alone.
        runs = grid()
        for r in runs:
            if r["variant"] == "plain" and r["seed"] in (2, 3):
                r["final_loss"] = 1.2
        rows = {r["seed"]: r for r in pg.analyse(runs)}
        self.assertTrue(rows[2]["false_alarm"] and rows[2]["stalled"] and rows[2]["recovered"])
        self.assertTrue(rows[3]["stalled"] and not rows[3]["acted"] and not rows[3]["recovered"])
        self.assertFalse(rows[1]["stalled"])  # it blew up: not a stall
        has_all(self, report_text(runs),
                "- stalled unprotected (never blew up, but ended above 1.1x the healthy level): 2/3 (67%); the "
                "policy acted on 1 of them (counted above as false alarms) and brought 1/2 (50%) within 1.1x",
                "false alarm on a stalled twin, recovered", "stalled, untouched")
        self.assertNotIn("stalled unprotected", report_text(grid()))

    def test_the_report_counts_and_names_the_reference(self):
        has_all(self, report_text(grid()),
                "- configurations x seeds with a policy run and its unprotected twin: 3",
                "- blew up unprotected: 1/3 (33%)",
                "- caught (the policy acted at or before the blow-up): 1/1 (100%)",
                "**1/1 (100%)** (target >= 95%)",
                "**1/3 (33%)** of all runs (target <= 5%)",
                "mean **18.7%**, median 0.0%, max 56.0%",
                "  - of the 2 policy runs that acted: mean 28.0%, median 28.0%",
                "median 20 steps",
                "| mxfp8_e4m3 | 4 | 256 | 0.001 | 1 | 500, - | 480, 1, fp32 (SUCCEEDED) | 0.95 (fp32) | rescued |",
                "false alarm")
        # A language model's grid: its reference is bf16, and the report says so.
        lm = report_text(grid(reference="bf16"))
        self.assertIn("| 0.95 (bf16) | rescued |", lm)


def lm_run(variant, fmt, seed, losses, **kw):
    """A language model's summary whose 10-step windows have the given mean losses (steps 1000)."""
    windows = [[10 * (i + 1), x] for i, x in enumerate(losses)]
    return summary(variant, fmt, seed, language_model=True, vocab=50257, loss_windows=windows, steps=10 * len(losses),
                   last_step=10 * len(losses), **kw)


class PairedBlowupTest(unittest.TestCase):
    # The reference's loss follows the text: 3 nats, then 7 in a harder part of the corpus from
    # step 500 on (2.3x its lowest, which the own-lowest rule calls a blow-up), then 3 again.
    TEXT = [3.0] * 50 + [7.0] * 20 + [3.0] * 30

    def test_a_run_that_follows_its_reference_through_harder_text_did_not_blow_up(self):
        run = [x * 1.2 for x in self.TEXT]
        self.assertIsNone(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(run)], 1000,
                                                [[10 * (i + 1), x] for i, x in enumerate(self.TEXT)], 50257))
        # Its own lowest would have it blown up at step 510.
        rows = [{"step": s, "loss": run[(s - 1) // 10]} for s in range(1, 1001)]
        self.assertEqual(pg.blowup_step(rows, 1000, pg.LM_BLOWUP_RATIO), 501)

    def test_above_the_ratio_of_its_reference_non_finite_or_above_ln_vocab(self):
        ref = [[10 * (i + 1), x] for i, x in enumerate(self.TEXT)]
        run = [x for x in self.TEXT]
        run[80] = 3.0 * 1.51  # steps 801..810: above 1.5x the reference's 3.0
        self.assertEqual(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(run)], 1000, ref), 810)
        run[80] = 3.0 * 1.49
        self.assertIsNone(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(run)], 1000, ref))
        run[30] = None  # steps 301..310: a non-finite loss in the window
        self.assertEqual(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(run)], 1000, ref), 310)
        # Alone (the reference itself): only non-finite or above ln(50257) = 10.8 counts.
        alone = [3.0] * 40 + [10.0] * 10 + [10.9] + [3.0] * 49
        self.assertEqual(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(alone)], 1000, None, 50257),
                         510)
        self.assertIsNone(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(alone)], 1000, None, None))
        # Within the warm-up (the first 5%: steps 1..50) nothing counts.
        early = [None if i < 5 else 3.0 for i in range(100)]
        self.assertIsNone(pg.paired_blowup_step([[10 * (i + 1), x] for i, x in enumerate(early)], 1000, ref))

    def test_pair_language_models_judges_each_run_against_its_own_seeds_reference(self):
        text = [3.0] * 50 + [5.0] * 20 + [3.0] * 30
        runs = [
            lm_run("fp32", "bf16", 1, text, blowup_step=501),
            lm_run("fp32", "bf16", 2, [x * 1.4 for x in text], blowup_step=501),
            # Seed 1 diverges from step 801 (2x its reference); seed 2's run is 1.2x seed 2's
            # reference (which is 1.4x seed 1's): healthy, although 1.68x seed 1's.
            lm_run("plain", "mxfp4", 1, text[:80] + [6.0] * 20, blowup_step=501),
            lm_run("plain", "mxfp4", 2, [x * 1.68 for x in text], blowup_step=501),
            # A summary from before the windows existed keeps its own verdict.
            summary("plain", "mxfp8_e4m3", 1, language_model=True, blowup_step=501),
            summary("plain", "mxfp8_e4m3", 3),  # the proxy: untouched
        ]
        judged = pg.pair_language_models(runs)
        by = {(r["variant"], r["format"], r["seed"]): r for r in judged}
        self.assertEqual((by[("fp32", "bf16", 1)]["blowup_step"], by[("fp32", "bf16", 1)]["blowup_rule"]), (None, "alone"))
        self.assertIsNone(by[("fp32", "bf16", 2)]["blowup_step"])
        self.assertEqual((by[("plain", "mxfp4", 1)]["blowup_step"], by[("plain", "mxfp4", 1)]["blowup_rule"]),
                         (810, "paired"))
        self.assertIsNone(by[("plain", "mxfp4", 2)]["blowup_step"])
        self.assertEqual((by[("plain", "mxfp8_e4m3", 1)]["blowup_step"], by[("plain", "mxfp8_e4m3", 1)]["blowup_rule"]),
                         (501, "own-lowest"))
        self.assertNotIn("blowup_rule", by[("plain", "mxfp8_e4m3", 3)])
        self.assertEqual(runs[2]["blowup_step"], 501)  # the inputs are not changed

    def test_the_report_uses_the_paired_rule_and_says_so(self):
        runs = [
            lm_run("fp32", "bf16", 1, self.TEXT, final_loss=3.0),
            lm_run("plain", "mxfp4", 1, self.TEXT[:80] + [6.0] * 20, final_loss=6.0, blowup_step=501),
            lm_run("default", "mxfp4", 1, self.TEXT, final_loss=3.1, first_action_step=805, blowup_step=501),
            lm_run("plain", "mxfp4", 2, self.TEXT, final_loss=3.0, blowup_step=501),
            lm_run("default", "mxfp4", 2, self.TEXT, final_loss=3.0, blowup_step=501),
            lm_run("fp32", "bf16", 2, self.TEXT, final_loss=3.0, blowup_step=501),
        ]
        text = report_text(runs)
        has_all(self, text, "- blew up unprotected: 1/2 (50%)",
                "- caught (the policy acted at or before the blow-up): 1/1 (100%)",
                "**0/2 (0%)** of all runs (target <= 5%)",
                "- language models' blow-up rule: alone 2, paired 4 runs",
                "| mxfp4 | 4 | 256 | 0.001 | 1 | 810, 6 | 805, 3.1, mxfp4 (SUCCEEDED) | 3 (bf16) | rescued |")


class OwnBlowupTest(unittest.TestCase):
    # Shuffled batches: a healthy run's loss falls smoothly; one that merely trains worse than bf16
    # falls too; one that diverges rises above its own lowest.
    HEALTHY = [6.0 - 0.02 * i for i in range(100)]  # 6.0 .. 4.02

    def test_a_rise_to_its_ratio_of_the_lowest_earlier_window_non_finite_or_above_ln_vocab(self):
        windows = lambda xs: [[10 * (i + 1), x] for i, x in enumerate(xs)]
        self.assertIsNone(pg.own_blowup_step(windows(self.HEALTHY), 1000, 50257))
        worse = [x * 1.5 for x in self.HEALTHY]  # 1.5x bf16 all along, never above its own lowest
        self.assertIsNone(pg.own_blowup_step(windows(worse), 1000, 50257))
        rising = self.HEALTHY[:40] + [5.2 + 0.05 * i for i in range(60)]  # lowest 5.2 at step 410, then up to 8.15
        # 1.2 x 5.2 = 6.24: the first window at or above it is 5.2 + 0.05 * 21 = 6.25, steps 611..620.
        self.assertEqual(pg.own_blowup_step(windows(rising), 1000, 50257), 620)
        self.assertIsNone(pg.own_blowup_step(windows(rising), 1000, 50257, ratio=2.0))
        spike = list(self.HEALTHY)
        spike[70] = None
        self.assertEqual(pg.own_blowup_step(windows(spike), 1000, 50257), 710)
        spike[70] = 11.0  # above ln(50257) = 10.83
        self.assertEqual(pg.own_blowup_step(windows(spike), 1000, 50257, ratio=100.0), 710)
        # Within the warm-up (steps 1..50) nothing counts, nor sets the lowest.
        early = [1.0] * 5 + self.HEALTHY[5:]
        self.assertIsNone(pg.own_blowup_step(windows(early), 1000, 50257))

    def test_the_report_with_lm_rule_own_judges_runs_by_their_own_history_and_says_so(self):
        healthy = OwnBlowupTest.HEALTHY
        runs = [
            lm_run("fp32", "bf16", 1, healthy, final_loss=4.0),
            # Trains 1.6x worse than bf16 all along: the paired rule calls it a blow-up, own does not.
            lm_run("plain", "mxfp8_e4m3", 1, [x * 1.6 for x in healthy], final_loss=6.4),
            lm_run("default", "mxfp8_e4m3", 1, [x * 1.6 for x in healthy], final_loss=6.4),
            # Diverges from step 410.
            lm_run("plain", "mxfp4", 1, healthy[:40] + [5.2 + 0.05 * i for i in range(60)], final_loss=8.0),
            lm_run("default", "mxfp4", 1, healthy, final_loss=4.1, first_action_step=505),
        ]
        own = report_text(runs, "own")
        has_all(self, own, "- blew up unprotected: 1/2 (50%)",
                "- language models' blow-up rule: own 5 runs",
                "own: 10-step windows at 1.2x the lowest earlier one",
                "| mxfp4 | 4 | 256 | 0.001 | 1 | 620, 8 | 505, 4.1, mxfp4 (SUCCEEDED) | 4 (bf16) | rescued |")
        paired = report_text(runs)
        has_all(self, paired, "- blew up unprotected: 2/2 (100%)")


class GenTest(unittest.TestCase):
    def gen(self, *argv):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "sweep.yaml")
            saved = sys.argv
            sys.argv = ["policy-grid", "gen", *argv, "-o", out]
            try:
                with contextlib.redirect_stdout(io.StringIO()) as said:
                    pg.main()
            finally:
                sys.argv = saved
            with open(out) as f:
                return f.read(), said.getvalue()

    def test_the_language_model_grid(self):
        text, said = self.gen("--name", "lm", "--model", "gpt", "--layers", "8", "--widths", "512", "--lrs",
                              "2e-3,4e-3", "--seeds", "1,2", "--train", "t.bin", "--val", "v.bin")
        has_all(self, text, "model: {type: gpt, layers: 8, width: 512, heads: 8, context: 1024",
                "precision: [mxfp8_e4m3, mxfp8_e4m3, mxfp4, mxfp4, bf16]", "policy: [{}, default, {}, default, {}]",
                "steps: 3000", "batch: 16", "backend: cuda", "resources: {gpus: 0.25}", "shuffle: true}",
                "probe_every: 100")
        self.assertTrue(said.endswith("sweep.yaml: 20 runs\n"), said)  # 2 lrs x 2 seeds x 5 runs
        # The head kept in BF16, by the ladder's rung name; a made-up suffix is refused.
        text, _ = self.gen("--name", "lm", "--model", "gpt", "--widths", "512", "--formats", "mxfp4+bf16_head",
                           "--train", "t.bin", "--val", "v.bin")
        has_all(self, text, "precision: [mxfp4+bf16_head, mxfp4+bf16_head, bf16]")
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()):
            self.gen("--name", "lm", "--model", "gpt", "--widths", "512", "--formats", "mxfp4+fp8_head",
                     "--train", "t.bin", "--val", "v.bin")
        self.assertIn("unknown format 'mxfp4+fp8_head'", str(e.exception))

    def test_cpu_backend_and_sizes(self):
        text, _ = self.gen("--name", "tiny", "--model", "gpt", "--layers", "2", "--widths", "64", "--lrs", "1e-3",
                           "--seeds", "1", "--steps", "4", "--batch", "2", "--seq", "64", "--backend", "cpu",
                           "--train", "t.bin", "--val", "v.bin")
        has_all(self, text, "backend: cpu", "batch: 2", "seq: 64")
        self.assertNotIn("resources:", text)
        proxy, _ = self.gen("--name", "p", "--layers", "3", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                            "--probation", "500")
        self.assertIn("batch: 2048", proxy)
        self.assertIn("policy: [{}, default, {preset: default, probation: {after: 500}}", proxy)
        shorter, _ = self.gen("--name", "p", "--layers", "3", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                              "--rollback", "200")
        self.assertIn("policy: [{}, default, {preset: default, rollback: 200}, {}, default", shorter)
        self.assertEqual(pg.variant_of({"precision": "mxfp8_e4m3", "policy": "{preset: default, rollback: 200}"}),
                         "rollback")
        self.assertEqual(pg.variant_of({"precision": "mxfp8_e4m3", "policy": "{preset: default, probation: {after: 5}}"}),
                         "probation")
        written_out = "{ladder: [mxfp8_e4m3, fp32], rules: [{when: nonfinite, do: [{rollback: 100}, {switch: next}]}]}"
        self.assertEqual(pg.variant_of({"precision": "mxfp8_e4m3", "policy": written_out}), "default")
        lower, _ = self.gen("--name", "p", "--layers", "3", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                            "--rollback", "200", "--lr-fallbacks", "3")
        self.assertIn("policy: [{}, default, {preset: default, rollback: 200}, {preset: default, lr_fallbacks: 3}, {}",
                      lower)
        self.assertEqual(pg.variant_of({"precision": "mxfp6_e2m3", "policy": "{preset: default, lr_fallbacks: 3}"}),
                         "lr_fallbacks")
        self.assertEqual(pg.variant_of({"precision": "mxfp6_e2m3",
                                        "policy": "{preset: default, rollback: 200, lr_fallbacks: 3}"}),
                         "rollback+lr_fallbacks")
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            self.gen("--name", "p", "--layers", "3", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                     "--lr-fallbacks", "9")

    def test_policy_only_writes_the_policy_runs_and_nothing_else(self):
        text, said = self.gen("--name", "k", "--layers", "3,4", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                              "--policy-only")
        has_all(self, text, "precision: [mxfp8_e4m3, mxfp8_e4m3_bwd_e5m2, mxfp6_e2m3]",
                "policy: [default, default, default]", "(--policy-only: the unprotected twins and")
        self.assertTrue(said.endswith("sweep.yaml: 6 runs\n"), said)  # 2 depths x 3 formats
        variant, _ = self.gen("--name", "k", "--layers", "3", "--widths", "256", "--lrs", "1e-3", "--seeds", "1",
                              "--formats", "mxfp6_e2m3", "--rollback", "200", "--policy-only")
        self.assertIn("precision: [mxfp6_e2m3, mxfp6_e2m3]", variant)
        self.assertIn("policy: [default, {preset: default, rollback: 200}]", variant)

    def test_twins_only_writes_the_unprotected_runs_and_the_reference_and_nothing_else(self):
        text, said = self.gen("--name", "m", "--layers", "3,4", "--widths", "256", "--lrs", "3e-4", "--seeds", "1",
                              "--twins-only")
        has_all(self, text, "precision: [mxfp8_e4m3, mxfp8_e4m3_bwd_e5m2, mxfp6_e2m3, fp32]",
                "policy: [{}, {}, {}, {}]", "(--twins-only: the twins and references")
        self.assertNotIn("default", text.split("axes:")[1])
        self.assertTrue(said.endswith("sweep.yaml: 8 runs\n"), said)  # 2 depths x (3 formats + fp32)
        for clash in (["--policy-only"], ["--rollback", "200"], ["--probation", "500"], ["--lr-fallbacks", "3"]):
            with self.subTest(clash=clash), self.assertRaises(SystemExit) as e, \
                    contextlib.redirect_stderr(io.StringIO()):
                self.gen("--name", "m", "--layers", "3", "--widths", "256", "--lrs", "3e-4", "--seeds", "1",
                         "--twins-only", *clash)
            self.assertIn("--twins-only runs no policy", str(e.exception))

    def test_the_language_model_needs_its_shards(self):
        with self.assertRaises(SystemExit) as e, contextlib.redirect_stderr(io.StringIO()):
            self.gen("--name", "lm", "--model", "gpt", "--widths", "512")
        self.assertIn("needs --train and --val", str(e.exception))


class WarningSignalTest(unittest.TestCase):
    def test_the_lead_time_table_counts_stalled_false_alarms_apart(self):
        # Two unprotected runs probed every 100 steps with abs(zeta) 0.3 throughout (the bias rule's
        # signal fires at step 300): seed 1 blows up at 600 (warned 300 steps ahead), seed 2 never
        # blows up but ends at 1.2 against its reference's 0.95 (a stalled false alarm).
        runs = [summary("fp32", "fp32", seed, final_loss=0.95) for seed in (1, 2)] + [
            summary("plain", "mxfp8_e4m3", 1, blowup_step=600, final_loss=None),
            summary("plain", "mxfp8_e4m3", 2, final_loss=1.2)]
        # The series as `run` writes it (.csv.gz) and as docs/runs keeps it (.csv.xz) read the same.
        for suffix, opener in ((".csv.gz", gzip.open), (".csv.xz", lzma.open)):
            with self.subTest(suffix=suffix), tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "grid-series" + suffix)
                with opener(path, "wt") as f:
                    f.write("run,step,loss,grad_norm,sat_max,update_ratio,probe_zeta,probe_cosine\n")
                    for seed in (1, 2):
                        for step in range(1, 1001):
                            zeta = "-0.3" if step % 100 == 0 else ""
                            f.write(f"plain-mxfp8_e4m3-{seed},{step},1.0,1.0,0.0,0.001,{zeta},\n")
                text = pg.warning_study(runs, [path])
                row = [line for line in text.splitlines() if "bias rule" in line][0]
                self.assertEqual(row.split(" | ")[1:], ["1/1", "300", "300 / 300", "1/2", "1 |"])

    def test_the_bias_rule_signal_needs_its_probes_in_a_row(self):
        # Probes every other step (None between): the count carries over the steps without one,
        # and one probe at or under the threshold restarts it.
        zetas = [-0.2, None, -0.15, None, 0.1, None, -0.3, None, 0.2, None, -0.11, None, -0.5]
        fired = pg.probe_run_signal(zetas, 0.1, 3)
        self.assertEqual([i for i, f in enumerate(fired) if f], [10, 12])
        self.assertEqual(pg.probe_run_signal([float("nan"), -0.2, -0.2], 0.1, 2), [False, False, True])


if __name__ == "__main__":
    unittest.main()
