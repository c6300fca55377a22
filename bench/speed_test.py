"""Tests of bench/speed on the CPU: llm.c's log parser (on a fixture in llm.c's
exact output format), the ratios, targets and table, and a whole run with stand-in
binaries. Without Bazel: python3 bench/speed_test.py"""

import importlib.machinery
import importlib.util
import io
import json
import os
import re
import stat
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "testdata", "llmc_d12_b16.log")


def load_speed():
    # bench/speed is a script without a .py suffix, so it is loaded by path.
    loader = importlib.machinery.SourceFileLoader("speed", os.path.join(HERE, "speed"))
    spec = importlib.util.spec_from_loader("speed", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


speed = load_speed()
SHAPES = {s.key: s for s in speed.SHAPES}


def fixture_text():
    with open(FIXTURE) as f:
        return f.read()


def fixture_step_ms():
    # Read independently of the parser: the field before " ms |" on each step line.
    return [float(line.split(" ms |")[0].rsplit("| ", 1)[1]) for line in fixture_text().splitlines()
            if line.startswith("step ")]


def keel(shape, scheme, tokens_per_s, peak_mib=5000, smi=None, error=None):
    return speed.new_row("keel", SHAPES[shape], scheme, tokens_per_s=tokens_per_s, ms_per_step=1.0,
                         peak_mib=peak_mib, smi_peak_mib=smi, error=error)


def llmc(shape, tokens_per_s, peak_mib=6000, smi=None):
    return speed.new_row("llm.c", SHAPES[shape], "bf16", tokens_per_s=tokens_per_s, ms_per_step=1.0,
                         peak_mib=peak_mib, smi_peak_mib=smi)


class ParseLlmcLogTest(unittest.TestCase):
    def test_reads_the_table_the_memory_line_and_every_step(self):
        parsed = speed.parse_llmc_log(fixture_text())
        self.assertEqual(parsed["params"], 124475904)
        self.assertEqual((parsed["layers"], parsed["width"], parsed["heads"]), (12, 768, 12))
        self.assertEqual((parsed["batch"], parsed["seq"]), (16, 1024))
        self.assertEqual(parsed["recompute"], 1)
        self.assertEqual(parsed["device"], "NVIDIA H200")
        self.assertEqual(parsed["llmc_peak_tflops"], -1.0)
        self.assertEqual(parsed["memory_mib"], 9812)
        self.assertEqual([s["step"] for s in parsed["steps"]], list(range(1, 13)))
        self.assertEqual([s["ms"] for s in parsed["steps"]], fixture_step_ms())
        self.assertEqual(parsed["steps"][0]["mfu_percent"], -100.0)

    def test_row_skips_the_warmup_steps_and_takes_tokens_per_s_from_ms(self):
        ms = fixture_step_ms()
        expected_ms = sum(ms[speed.WARMUP_STEPS:]) / (len(ms) - speed.WARMUP_STEPS)
        row = speed.llmc_row(SHAPES["124m-b16"], speed.parse_llmc_log(fixture_text()), 989.0)
        self.assertAlmostEqual(row["ms_per_step"], expected_ms, places=9)
        self.assertEqual(row["timed_steps"], 10)
        self.assertAlmostEqual(row["tokens_per_s"], 16 * 1024 * 1000.0 / expected_ms, places=6)
        self.assertAlmostEqual(row["mfu"], row["tokens_per_s"] * 803478528 / 989e12, places=12)
        self.assertEqual(row["peak_mib"], 9812)
        self.assertIsNone(speed.llmc_row(SHAPES["124m-b16"], speed.parse_llmc_log(fixture_text()), None)["mfu"])

    def test_flops_per_token_is_llmc_formula(self):
        # Issue 12: 803.5M FLOPs/token for GPT-2 124M (N with the padded vocab) at T 1024.
        self.assertEqual(speed.flops_per_token(124475904, 12, 768, 1024), 803478528)

    def test_missing_parts_are_errors_that_name_them(self):
        text = fixture_text()
        no_steps = "\n".join(l for l in text.splitlines() if not l.startswith("step "))
        with self.assertRaisesRegex(speed.LlmcLogError, "no step lines"):
            speed.parse_llmc_log(no_steps)
        no_params = "\n".join(l for l in text.splitlines() if "num_parameters        |" not in l)
        with self.assertRaisesRegex(speed.LlmcLogError, "'params'"):
            speed.parse_llmc_log(no_params)
        crashed = text.split("step    2/12")[0] + "[CUDA ERROR] at file llmc/cudnn_att.cpp:151:\nout of memory\n"
        with self.assertRaisesRegex(speed.LlmcLogError, "no step after the 2 warm-up steps"):
            speed.llmc_row(SHAPES["124m-b16"], speed.parse_llmc_log(crashed), 989.0)
        bad_number = text.replace("| num_layers L          | 12 ", "| num_layers L          | xx ")
        with self.assertRaisesRegex(speed.LlmcLogError, "num_layers L.*'xx'"):
            speed.parse_llmc_log(bad_number)


class EvaluateTest(unittest.TestCase):
    def test_ratios_and_targets(self):
        rows = speed.evaluate([
            keel("124m-b16", "bf16", 180000, smi=9000), keel("124m-b16", "mxfp8_e4m3", 171000, smi=9500),
            keel("124m-b16", "mxfp4", 150000, smi=12000), llmc("124m-b16", 171428.57, smi=10000),
            keel("124m-b32", "bf16", 150000, peak_mib=7000), llmc("124m-b32", 200000, peak_mib=6500)])
        bf16, mxfp8, mxfp4, _, b32, _ = rows
        self.assertAlmostEqual(bf16["vs_llmc"], 180000 / 171428.57)
        self.assertEqual((bf16["speed"], bf16["memory"], bf16["memory_measure"]), ("met", "met", "nvidia-smi"))
        self.assertAlmostEqual(mxfp8["vs_bf16"], 0.95)
        self.assertIsNone(mxfp8["vs_llmc"])
        self.assertEqual((mxfp8["speed"], mxfp8["memory"]), ("met", "met"))
        self.assertEqual((mxfp4["speed"], mxfp4["memory"]), ("MISSED", "MISSED"))
        # B32 is held to llm.c at B32, and without nvidia-smi figures to the in-process ones.
        self.assertAlmostEqual(b32["vs_llmc"], 0.75)
        self.assertEqual((b32["speed"], b32["memory"], b32["memory_measure"]), ("MISSED", "MISSED", "cudaMemGetInfo"))
        self.assertEqual(speed.headline(rows), "gpt2-124m bf16 vs llm.c: 1.05x")
        self.assertEqual(speed.summary_counts(rows), "targets: 4 met, 4 missed; 0 case(s) failed")

    def test_headline_format_has_two_decimals(self):
        rows = speed.evaluate([keel("124m-b16", "bf16", 100000), llmc("124m-b16", 99000)])
        self.assertRegex(speed.headline(rows), r"^gpt2-124m bf16 vs llm\.c: \d+\.\d\dx$")
        self.assertEqual(speed.headline(rows), "gpt2-124m bf16 vs llm.c: 1.01x")

    def test_nothing_to_compare_with(self):
        rows = speed.evaluate([keel("124m-b16", "bf16", 100000), keel("124m-b16", "nvfp4", 95000),
                               keel("350m-b16", "bf16", 40000)])
        self.assertTrue(speed.headline(rows).startswith("gpt2-124m bf16 vs llm.c: n/a"))
        self.assertEqual([r["speed"] for r in rows], [None, "met", None])
        self.assertEqual([r["memory"] for r in rows], [None, None, None])
        self.assertEqual(speed.targets_text(rows[2]), "no baseline")

    def test_failed_cases_are_neither_compared_nor_baselines(self):
        rows = speed.evaluate([keel("124m-b16", "bf16", None, error="train_bench exit 1: boom"),
                               keel("124m-b16", "mxfp4", 95000), llmc("124m-b16", 99000)])
        self.assertIsNone(rows[1]["vs_bf16"])
        self.assertEqual(speed.targets_text(rows[0]), "FAILED: train_bench exit 1: boom")
        self.assertTrue(speed.headline(rows).endswith("n/a (no Keel bf16 and llm.c pair at 124M B16 x T1024)"))
        self.assertEqual(speed.summary_counts(rows), "targets: 1 met, 0 missed; 1 case(s) failed")

    def test_table_has_one_line_per_row_with_its_figures_and_marks(self):
        rows = speed.evaluate([keel("124m-b16", "bf16", 180000), keel("124m-b16", "mxfp4", 150000),
                               llmc("124m-b16", 171428.57)])
        lines = speed.format_table(rows, SHAPES)
        self.assertEqual(len(lines), 2 + len(rows))
        self.assertRegex(lines[0], r"^case\s+tokens/s\s+ms/step\s+peak MiB\s+smi MiB\s+MFU\s+vs llm\.c\s+vs bf16\s+targets$")
        self.assertRegex(lines[2], r"^keel\s+gpt2-124m B16xT1024 bf16\s+180000 .* 1\.05x .*speed >= 1\.0x llm\.c met")
        self.assertRegex(lines[3], r"0\.83x\s+speed >= 0\.9x bf16 MISSED, memory <= llm\.c met \(cudaMemGetInfo\)$")
        self.assertRegex(lines[4], r"^llm\.c\s+gpt2-124m B16xT1024 bf16\s+171429 ")


def write_script(path, body):
    with open(path, "w") as f:
        f.write("#!/usr/bin/env python3\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


# A stand-in train_bench: writes the JSON line train_bench writes, tokens/s by scheme.
FAKE_TRAIN_BENCH = r"""
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
rate = {"bf16": 180000.0, "mxfp8_e4m3": 171000.0, "mxfp4": 150000.0, "nvfp4": 175000.0, "nvfp4_recipe": 160000.0}
if a["--schemes"] == "nvfp4_recipe" and a["--model"] == "gpt2-124m":
    print("train_bench: nvfp4_recipe: stand-in failure"); sys.exit(1)
open(a["--tokens"], "wb").write(b"\0" * 1024)
t = rate[a["--schemes"]] * (0.5 if a["--model"] == "gpt2-350m" else 1.0)
json.dump({"model": a["--model"], "scheme": a["--schemes"], "batch": int(a["--batch"]), "seq": int(a["--seq"]),
           "ms_per_step": int(a["--batch"]) * int(a["--seq"]) * 1000.0 / t, "tokens_per_s": t, "peak_mib": 9000,
           "mfu": 0.5, "params": 124475904, "peak_tflops": 988.9, "peak_tflops_source": "stand-in",
           "device": "NVIDIA H200, sm_90, 132 SMs"}, open(a["--json"], "w"))
"""


class MainTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.bin = os.path.join(self.dir, "bin")
        os.makedirs(self.bin)
        write_script(os.path.join(self.bin, "train_bench"), FAKE_TRAIN_BENCH)
        self.out = os.path.join(self.dir, "out")

    def run_main(self, *extra):
        stdout, stderr = io.StringIO(), io.StringIO()
        with redirect_stdout(stdout), redirect_stderr(stderr):
            code = speed.main(["--bin", self.bin, "--out", self.out, "--tokens", os.path.join(self.dir, "t.bin")]
                              + list(extra))
        return code, stdout.getvalue()

    def test_runs_every_case_prints_the_table_and_writes_the_files(self):
        code, printed = self.run_main()
        self.assertEqual(code, 1)  # the stand-in nvfp4_recipe case failed
        cases = [l for l in printed.splitlines() if l.startswith("keel ")]
        self.assertEqual([c.split()[3] for c in cases], speed.SCHEMES + ["bf16", "bf16"])
        self.assertEqual([c.split()[1] for c in cases], ["gpt2-124m"] * 6 + ["gpt2-350m"])
        self.assertRegex(printed, r"keel\s+gpt2-124m B16xT1024 mxfp4\s+150000 .*0\.83x\s+speed >= 0\.9x bf16 MISSED")
        self.assertRegex(printed, r"nvfp4_recipe .*FAILED: train_bench exit 1: train_bench: nvfp4_recipe: stand-in failure")
        self.assertIn("988.9 TFLOP/s dense BF16 (stand-in)", printed)
        self.assertEqual(printed.strip().splitlines()[-1], "gpt2-124m bf16 vs llm.c: n/a (no Keel bf16 and llm.c pair at "
                         "124M B16 x T1024)")
        with open(os.path.join(self.out, "summary.txt")) as f:
            self.assertEqual(f.read(), printed)
        with open(os.path.join(self.out, "results.json")) as f:
            results = json.load(f)
        self.assertEqual(len(results["rows"]), 7)
        with open(os.path.join(self.out, "commands.txt")) as f:
            commands = f.read().splitlines()
        self.assertEqual(len(commands), 7)
        self.assertIn("--model gpt2-350m --batch 16 --seq 1024 --schemes bf16 --steps 10", commands[-1])
        self.assertTrue(os.path.exists(os.path.join(self.out, "raw", "keel-124m-b16-nvfp4_recipe.log")))

    def test_all_schemes_and_shapes_subset(self):
        code, printed = self.run_main("--shapes", "350m-b16", "--all-schemes")
        self.assertEqual(code, 0)
        cases = [l.split()[3] for l in printed.splitlines() if l.startswith("keel ")]
        self.assertEqual(cases, speed.SCHEMES)

    def test_llmc_case_from_a_stand_in_binary_that_prints_the_fixture(self):
        fake = os.path.join(self.bin, "train_gpt2cu")
        write_script(fake, "import sys\nsys.stdout.write(open(%r).read())\n" % FIXTURE)
        args = speed.parse_args(["--out", self.out])
        os.makedirs(os.path.join(self.out, "raw"))
        commands = []
        report = speed.Report(os.devnull)
        with redirect_stdout(io.StringIO()):
            row = speed.run_llmc(args, fake, [], SHAPES["124m-b16"], 989.0, report, commands)
        report.close()
        self.assertIsNone(row["error"])
        self.assertEqual(row["engine"], "llm.c")
        self.assertEqual(row["peak_mib"], 9812)
        self.assertRegex(commands[0], r"train_gpt2cu -i \S+ -j \S+ -e d12 -b 16 -t 1024 -x 12 -l 6e-4 -c 0\.1 .* -r 1 ")

    def test_missing_binary_or_llmc_dir_is_a_clear_error(self):
        with self.assertRaisesRegex(speed.BenchError, r"--bin: no executable train_bench in '/nonexistent'"):
            speed.main(["--bin", "/nonexistent", "--out", self.out])
        with self.assertRaisesRegex(speed.BenchError, r"--llmc: '/nonexistent' is not a directory"):
            speed.main(["--bin", self.bin, "--out", self.out, "--llmc", "/nonexistent"])
        args = speed.parse_args(["--llmc", self.dir, "--out", self.out])
        report = speed.Report(os.devnull)
        with self.assertRaisesRegex(speed.BenchError, r"--llmc: '.*' has no Makefile \(make it with scripts/fetch-llmc"):
            speed.build_llmc(args, report, [])
        report.close()

    def test_bad_flags_name_the_flag_the_value_and_what_is_allowed(self):
        for argv, message in [(["--shapes", "124m-b64"], "--shapes: '124m-b64' is not allowed (comma-separated, "
                                                         "each one of 124m-b16, 124m-b32, 350m-b16)"),
                              (["--steps", "0"], "--steps: '0' is not allowed (1 or more)"),
                              (["--llmc-recompute", "3"], "--llmc-recompute: invalid choice: 3")]:
            stderr = io.StringIO()
            with redirect_stderr(stderr), self.assertRaises(SystemExit) as exit:
                speed.parse_args(argv)
            self.assertEqual(exit.exception.code, 2)
            self.assertIn(message, stderr.getvalue())


class SyncTreeTest(unittest.TestCase):
    def test_rewrites_only_what_changed(self):
        src, dst = tempfile.mkdtemp(), tempfile.mkdtemp()
        os.makedirs(os.path.join(src, "llmc"))
        for path, text in [("Makefile", "all:\n"), ("llmc/a.h", "// a\n")]:
            with open(os.path.join(src, path), "w") as f:
                f.write(text)
        self.assertEqual(speed.sync_tree(src, dst), 2)
        self.assertEqual(speed.sync_tree(src, dst), 0)
        with open(os.path.join(src, "llmc", "a.h"), "w") as f:
            f.write("// b\n")
        self.assertEqual(speed.sync_tree(src, dst), 1)
        with open(os.path.join(dst, "llmc", "a.h")) as f:
            self.assertEqual(f.read(), "// b\n")


class FindCudnnTest(unittest.TestCase):
    def test_finds_a_wheel_layout_with_only_the_versioned_library(self):
        root = tempfile.mkdtemp()
        include, lib = os.path.join(root, "include"), os.path.join(root, "lib")
        os.makedirs(include)
        os.makedirs(lib)
        open(os.path.join(include, "cudnn.h"), "w").close()
        with open(os.path.join(include, "cudnn_version.h"), "w") as f:
            f.write("#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 13\n#define CUDNN_PATCHLEVEL 0\n")
        self.assertIsNone(speed.find_cudnn(root, None))
        open(os.path.join(lib, "libcudnn.so.9"), "w").close()
        self.assertEqual(speed.find_cudnn(root, None), (include, lib, os.path.join(lib, "libcudnn.so.9")))
        self.assertEqual(speed.cudnn_version(include), "9.13.0")


if __name__ == "__main__":
    unittest.main()
