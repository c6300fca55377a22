"""train_bench on the CPU at a tiny batch (1 x 64) of the real GPT-2 124M shape:
one case, its JSON line, the MFU arithmetic, the token shard llm.c reads, and the
flag errors. Usage: train_bench_test.py PATH_TO_TRAIN_BENCH (Bazel passes it)."""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

TRAIN_BENCH = None


class TrainBenchTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        cls.tokens = os.path.join(cls.dir, "tokens.bin")
        cls.json_path = os.path.join(cls.dir, "cases.jsonl")
        cls.result = subprocess.run(
            [TRAIN_BENCH, "--backend", "cpu", "--model", "gpt2-124m", "--batch", "1", "--seq", "64", "--schemes",
             "bf16", "--steps", "1", "--only", "gpt", "--tokens", cls.tokens, "--json", cls.json_path,
             "--peak-tflops", "0.5", "--probe", "50", "--snapshots", "40"], capture_output=True, text=True,
            timeout=600)

    def test_runs_one_case_and_writes_its_json_line(self):
        self.assertEqual(self.result.returncode, 0, self.result.stderr)
        with open(self.json_path) as f:
            lines = f.read().splitlines()
        self.assertEqual(len(lines), 1)
        case = json.loads(lines[0])
        self.assertEqual((case["model"], case["scheme"], case["batch"], case["seq"], case["steps"]),
                         ("gpt2-124m", "bf16", 1, 64, 1))
        # GPT-2 124M with the vocab padded to 50304, as llm.c counts it.
        self.assertEqual(case["params"], 124475904)
        self.assertEqual(case["flops_per_token"], 6 * 124475904 + 6 * 12 * 768 * 64)
        self.assertAlmostEqual(case["tokens_per_s"], 64 * 1000.0 / case["ms_per_step"], delta=1e-6 * case["tokens_per_s"])
        self.assertEqual(case["peak_tflops"], 0.5)
        self.assertEqual(case["peak_tflops_source"], "--peak-tflops")
        self.assertAlmostEqual(case["mfu"], case["tokens_per_s"] * case["flops_per_token"] / 0.5e12, places=12)
        self.assertIsNone(case["peak_mib"])  # the CPU backend has no device memory
        self.assertTrue(case["device"].startswith("cpu"))
        self.assertGreater(case["loss"], 9.0)  # ln(50257) = 10.8 at random init

    def test_snapshots_print_and_write_their_cost(self):
        # --snapshots 40: 3 memory snapshots of the 124M model's state and 2 checkpoints, each
        # amortized over 40 steps; a snapshot is 12 bytes a parameter: 1,425 MiB.
        self.assertRegex(self.result.stdout, r"policy snapshots: in memory [\d.]+ ms each \(the ring's first entry, "
                                             r"allocating: [\d.]+ ms\), as a checkpoint on disk [\d.]+ ms; every 40 "
                                             r"steps: memory \+[\d.]+%, disk \+[\d.]+% of the step \(every 40 steps "
                                             r"in memory \(1 kept, 1425 MiB each\)\)")
        with open(self.json_path) as f:
            case = json.loads(f.read().splitlines()[0])
        self.assertEqual(case["snapshot_every"], 40)
        for key in ("snapshot_memory_ms", "snapshot_alloc_ms", "snapshot_disk_ms"):
            self.assertGreater(case[key], 0, key)
        self.assertAlmostEqual(case["snapshot_memory_overhead"], case["snapshot_memory_ms"] / (40 * case["ms_per_step"]),
                               places=9)
        self.assertAlmostEqual(case["snapshot_disk_overhead"], case["snapshot_disk_ms"] / (40 * case["ms_per_step"]),
                               places=9)

    def test_probe_twin_prints_and_writes_its_cost(self):
        # --probe 50: the case again with probe_every 1, its extra time amortized over 50 steps.
        self.assertIn("then with the gradient-bias probe on every step (fp32 reference; cost amortized over 50 steps)",
                      self.result.stdout)
        self.assertRegex(self.result.stdout, r"[\d.]+ ms/step with the gradient-bias probe \(fp32 reference\) on every step: "
                                             r"\+-?[\d.]+ ms \(\+-?[\d.]+%\); every 50 steps: \+-?[\d.]+% of the step; "
                                             r"peak n/a MiB \(without: n/a\)")
        with open(self.json_path) as f:
            case = json.loads(f.read().splitlines()[0])
        self.assertEqual((case["probe_every"], case["probe_reference"]), (50, "fp32"))
        self.assertAlmostEqual(case["probe_overhead"],
                               (case["probe_ms_per_step"] - case["ms_per_step"]) / (50 * case["ms_per_step"]), places=9)
        # (Not compared with ms_per_step: one timed step on a shared CPU is too noisy to order them.)
        self.assertGreater(case["probe_ms_per_step"], 0)
        self.assertIsNone(case["probe_peak_mib"])
        self.assertNotIn("analytics_every", case)

    def test_prints_the_case_with_na_memory(self):
        self.assertRegex(self.result.stdout, r"gpt2-124m bf16 B1xT64 +[\d.]+ ms/step +\d+ tok/s  peak +n/a MiB  MFU +[\d.]+%")
        self.assertIn("gpt2-124m shape: 12 layers, 768 wide, 12 heads, context 1024", self.result.stdout)
        self.assertIn("1.000x of bf16's tokens/s", self.result.stdout)

    def test_token_shard_is_llmc_format(self):
        with open(self.tokens, "rb") as f:
            header = struct.unpack("<256i", f.read(1024))
            size = 1024 + 2 * header[2]
            f.seek(0, os.SEEK_END)
            self.assertEqual(f.tell(), size)
        self.assertEqual(header[:2], (20240520, 1))
        self.assertEqual(header[2], 4 << 20)

    def test_bad_flags_name_the_flag_the_value_and_what_is_allowed(self):
        for args, message in [
            (["--schemes", "bf16,fp9"], "train_bench: --schemes: 'fp9' is not allowed (comma-separated, each one of "),
            (["--model", "gpt2-xl"], "train_bench: --model: 'gpt2-xl' is not allowed (gpt2-124m, gpt2-350m)"),
            (["--seq", "1025"], "train_bench: --seq: '1025' is not allowed (1 .. 1024)"),
            (["--batch", "0"], "train_bench: --batch: '0' is not allowed (1 .. 65536)"),
            (["--probe-reference", "fp16"], "train_bench: --probe-reference: 'fp16' is not allowed (fp32, bf16)"),
        ]:
            run = subprocess.run([TRAIN_BENCH] + args, capture_output=True, text=True, timeout=60)
            self.assertEqual(run.returncode, 2, args)
            self.assertTrue(run.stderr.startswith(message), run.stderr)

    def test_help_lists_every_flag(self):
        run = subprocess.run([TRAIN_BENCH, "--help"], capture_output=True, text=True, timeout=60)
        self.assertEqual(run.returncode, 0)
        for flag in ["--backend", "--steps", "--only", "--no-stats", "--model", "--batch", "--seq", "--schemes",
                     "--tokens", "--json", "--peak-tflops", "--analytics", "--analytics-maps", "--probe", "--probe-reference",
                     "--head-chunk-mib", "--profile"]:
            self.assertIn("  " + flag + " ", run.stdout)


if __name__ == "__main__":
    TRAIN_BENCH = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 else "bazel-bin/bench/train_bench"
    unittest.main()
