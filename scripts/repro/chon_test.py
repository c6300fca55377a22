"""chon.py's report arithmetic on synthetic runs: the gaps to bf16, CHON's reduction of the
recipe's gap, the early/late outlier phases, resumed steps counted once, and the files written."""
import json
import math
import os
import tempfile
import unittest

from repro import chon


def read(path):
    with open(path) as f:
        return f.read()


def write_run(work, name, lines, done=True):
    d = os.path.join(work, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for m in lines:
            f.write(json.dumps(m) + "\n")
    if done:
        open(os.path.join(d, "DONE"), "w").close()


def lines(final_val, top1_early, top1_late, steps=100, tps=1000.0):
    out = []
    for s in range(1, steps + 1):
        m = {"step": s, "loss": 3.0, "tokens_per_s": tps, "scheme": "x"}
        if s % 10 == 0:
            m["analytics"] = {"layers.0.attn.qkv": {"fwd_x": {
                "top1_over_median": top1_early if s <= 50 else top1_late, "kurtosis": 3.0,
                "hot_overlap": 0.2 if s <= 50 else 0.9, "ftz_rate": 0.01 if s <= 50 else 0.03}}}
        if s % 50 == 0:
            m["val_loss"] = final_val + (0.5 if s < steps else 0.0)
        out.append(m)
    return out


class ChonReportTest(unittest.TestCase):
    def test_gaps_reduction_and_phases(self):
        with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as out:
            with open(os.path.join(work, "base.yaml"), "w") as f:
                f.write("batch: 4\nseq: 64\n")
            write_run(work, "gla-bf16", lines(2.00, 10, 40))
            write_run(work, "gla-nvfp4_recipe", lines(2.04, 10, 40, tps=800))
            write_run(work, "gla-nvfp4_hcp", lines(2.03, 10, 40, tps=700))
            # Resumed: steps 41..50 written twice, the later lines count.
            resumed = lines(2.02, 10, 40, tps=600)
            write_run(work, "gla-chon", resumed[:50] + resumed[40:])
            write_run(work, "sa-bf16", lines(1.90, 5, 5), done=False)
            chon.write_report(work, out)
            summary = json.loads(read(os.path.join(out, "runs.json")))
            g = summary["gla"]["gaps"]
            self.assertAlmostEqual(g["nvfp4_recipe"], 0.02)
            self.assertAlmostEqual(g["chon"], 0.01)
            self.assertAlmostEqual(summary["gla"]["chon_reduction"], 0.5)
            self.assertEqual(summary["sa"]["gaps"], {"bf16": 0.0})
            text = read(os.path.join(out, "summary.md"))
            self.assertTrue(summary["gla"]["finished"])
            self.assertFalse(summary["sa"]["finished"])
            self.assertIn("**Not every run has finished**", text.split("## gla")[0])
            self.assertNotIn("**Not every run has finished**", text.split("## gla")[1])
            curves = json.loads(read(os.path.join(out, "curves.json")))
            self.assertEqual(curves["gla-bf16"]["val"], [[50, 2.5], [100, 2.0]])
            self.assertEqual([s for s, _ in curves["gla-chon"]["train_every_100"]], [100])
            self.assertIn("a reduction of **50.0%**", text)
            self.assertIn("| chon | 100 | 0.0M | yes | 2.0200 | +1.00% |", text)
            self.assertIn("| bf16 | 100 | 0.0M | no | 1.9000 | +0.00% |", text)  # sa: not finished
            # top-1/median 10 early, 40 late; overlap 0.2 early, 0.9 late.
            self.assertIn("| layers.0.attn.qkv | 10.0 | 40.0 | 3.0 | 3.0 | 0.20 | 0.90 | 1.00% | 3.00% |", text)
            # Evaluations at 50 and 100; the second half is step 100 alone.
            self.assertEqual(summary["gla"]["second_half_steps"], [100])
            self.assertAlmostEqual(summary["gla"]["second_half_mean_gaps"]["nvfp4_recipe"], 0.02)
            self.assertAlmostEqual(summary["gla"]["second_half_chon_reduction"], 0.5)
            self.assertIn("| **mean** | **+2.00%** | **+1.50%** | **+1.00%** |", text)
            self.assertIn("CHON is below the recipe at 1 of 1 evaluations.", text)
            for plot in ("gla-val.svg", "gla-outliers.svg", "sa-val.svg"):
                self.assertTrue(read(os.path.join(out, "plots", plot)).startswith("<svg"), plot)

    def test_gaps_by_evaluation_average_the_second_half(self):
        def run(vals):
            return {"val": vals}
        runs = {("gla", "bf16"): run([(100, 2.0), (200, 2.0), (300, 4.0), (400, 2.0)]),
                ("gla", "nvfp4_recipe"): run([(100, 3.0), (200, 2.1), (300, 4.4), (400, 2.04)]),
                # chon has no evaluation at 200: only the shared steps count.
                ("gla", "chon"): run([(100, 2.0), (300, 4.0), (400, 2.02)])}
        steps, per, means, late = chon.gaps_by_evaluation(runs, "gla")
        self.assertEqual(steps, [100, 300, 400])
        self.assertEqual(late, [300, 400])
        self.assertAlmostEqual(per["nvfp4_recipe"][0], 0.5)
        self.assertAlmostEqual(means["nvfp4_recipe"], (0.1 + 0.02) / 2)
        self.assertAlmostEqual(means["chon"], (0.0 + 0.01) / 2)
        self.assertEqual(chon.gaps_by_evaluation({("gla", "chon"): run([(1, 1.0)])}, "gla"), ([], {}, {}, []))

    def test_outlier_phases_take_fifths(self):
        analytics = [(s, {"l": {"fwd_x": {"top1_over_median": float(s), "kurtosis": 1.0}}}) for s in range(1, 11)]
        p = chon.outlier_phases(analytics)
        self.assertEqual(p["l"]["early"][0], 1.5)  # steps 1, 2
        self.assertEqual(p["l"]["late"][0], 9.5)   # steps 9, 10
        self.assertTrue(math.isnan(p["l"]["late"][2]))  # no overlap given
        self.assertEqual(chon.outlier_phases([]), {})

    def test_base_config_steps_follow_the_tokens(self):
        args = chon.build_parser().parse_args(
            ["run", "--train", "t.bin", "--val", "v.bin", "--work", "w", "--out", "o", "--size", "tiny",
             "--tokens", "25600", "--batch", "4", "--seq", "64"])
        text, steps = chon.base_yaml(args, "tiny")
        self.assertEqual(steps, 100)
        self.assertIn("steps: 100\n", text)
        self.assertIn("model: {type: llama, layers: 3, width: 64", text)
        self.assertEqual(chon.run_argv("gla", "chon", "tiny"),
                         ["--set", "model.type=gla", "--set", "model.heads=2", "--set", "precision=chon"])


if __name__ == "__main__":
    unittest.main()
