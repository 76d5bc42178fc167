#!/usr/bin/env python3
"""Tests of bench/prefill.py and bench/plot_prefill.py that need no GPU and no
PyTorch: merging, the markdown, the plot (when matplotlib is there), re-plotting
from the json, and the `cuflash bench` command line that prefill.py builds
(checked against the real parser when $CUFLASH_CLI names the command).

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
from unittest import mock

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_testing import captured_commands, write_fake_cuflash  # noqa: E402
import plot_prefill  # noqa: E402
import prefill  # noqa: E402

META = dict(dtype="bf16", device="NVIDIA H100 80GB HBM3", date="2026-11-23T10:00Z", commit="abc1234",
            torch="2.11.0+cu130", layout="bshd")
# Roughly the ANCHORS.md figures, with cuflash at 0.9-1.1x flash.
PEERS = {"torch_flash": 300.0, "torch_cudnn": 450.0, "torch_efficient": 130.0}


def fake_results(with_failures: bool = True) -> list[dict]:
    args = prefill.parse_args([])
    results = []
    for point in prefill.points(args):
        scale = (0.5 if point["causal"] else 1.0) * (0.8 if point["pass_name"] == "fwdbwd" else 1.0)
        scale *= 0.7 + 0.05 * (point["seqlen"].bit_length() - 10)
        for backend, peak in PEERS.items():
            results.append(prefill.result_row(point, backend, median_ms=fake_ms(point, peak * scale), reps=50))
        ratio = 0.9 if point["seqlen"] <= 1024 else 1.1
        error = None
        if with_failures and point["head_dim"] == 128 and point["seqlen"] == 16384 and point["pass_name"] == "fwdbwd":
            error = "unsupported: backend cuda: not yet"
        results.append(prefill.result_row(point, "cuflash_cuda", median_ms=None if error else
                                          fake_ms(point, PEERS["torch_flash"] * scale * ratio), reps=50, error=error))
    return results


def fake_ms(point: dict, tflops: float) -> float:
    flops = prefill.flops(point["pass_name"], point["batch"], point["heads"], point["seqlen"], point["head_dim"],
                          point["causal"])
    return flops / (tflops * 1e12) * 1e3


class MergeAndReport(unittest.TestCase):
    def test_rows_have_the_issue_keys(self):
        rows = plot_prefill.merge_rows(fake_results(), META)
        self.assertEqual(len(rows), 72)
        for row in rows:
            for key in ("pass", "head_dim", "causal", "seqlen", "batch", "heads", "dtype", "device", "tflops"):
                self.assertIn(key, row)
            self.assertEqual(row["batch"] * row["seqlen"], 16384)
            self.assertEqual(row["heads"] * row["head_dim"], 2048)
            self.assertEqual(list(row["tflops"]), ["cuflash_cuda", "torch_flash", "torch_cudnn", "torch_efficient"])
        first = rows[0]
        self.assertEqual((first["pass"], first["head_dim"], first["causal"], first["seqlen"]), ("fwd", 64, False, 512))
        self.assertAlmostEqual(rows[0]["tflops"]["torch_flash"], 300.0 * 0.7, places=1)
        failed = [row for row in rows if row["tflops"]["cuflash_cuda"] is None]
        self.assertEqual(len(failed), 2)
        self.assertIn("unsupported", failed[0]["errors"]["cuflash_cuda"])

    def test_markdown_has_ratios_and_the_shortfalls(self):
        rows = plot_prefill.merge_rows(fake_results(), META)
        text = plot_prefill.render_markdown(rows)
        self.assertIn("NVIDIA H100 80GB HBM3", text)
        self.assertIn("abc1234", text)
        self.assertIn("| cuflash_cuda / torch_flash |", text.replace(" | cuflash_cuda / torch_cudnn", ""))
        self.assertIn("## Points where cuflash_cuda / torch_flash < 1.0", text)
        # seqlen 512 and 1k are at 0.9x: 2 seqlens x 3 D x 2 masks x 2 passes.
        shortfalls = [line for line in text.splitlines() if line.startswith("- ") and ": 0.90 (" in line]
        self.assertEqual(len(shortfalls), 24)
        self.assertIn("## Failed points", text)
        self.assertIn("unsupported: backend cuda: not yet", text)
        self.assertIn("| 128 | causal | 16k | 1×16 | — |", text)

    def test_report_files_and_replot(self):
        rows = plot_prefill.merge_rows(fake_results(), META)
        with tempfile.TemporaryDirectory() as out:
            plot_prefill.write_report(rows, out)
            with open(os.path.join(out, "prefill.json")) as f:
                self.assertEqual(json.load(f), rows)
            with open(os.path.join(out, "prefill.md")) as f:
                first = f.read()
            if has_matplotlib():
                with open(os.path.join(out, "prefill.png"), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
            os.remove(os.path.join(out, "prefill.md"))
            subprocess.run([sys.executable, os.path.join(HERE, "plot_prefill.py"), os.path.join(out, "prefill.json")],
                           check=True, capture_output=True)
            with open(os.path.join(out, "prefill.md")) as f:
                self.assertEqual(f.read(), first)

    def test_subset_without_failures(self):
        results = [r for r in fake_results(with_failures=False) if r["pass"] == "fwd" and r["head_dim"] == 128]
        rows = plot_prefill.merge_rows(results, META)
        text = plot_prefill.render_markdown(rows, None)
        self.assertNotIn("Failed points", text)
        self.assertNotIn("forward + backward", text)
        if has_matplotlib():
            with tempfile.TemporaryDirectory() as out:
                self.assertTrue(plot_prefill.write_plot(rows, os.path.join(out, "p.png")))

    def test_disagreeing_shapes_are_refused(self):
        results = fake_results()[:2]
        results[1] = dict(results[1], batch=results[1]["batch"] * 2)
        with self.assertRaises(ValueError):
            plot_prefill.merge_rows(results, META)


def fake_small_results() -> list[dict]:
    args = prefill.parse_args([])
    results = []
    for point in prefill.points(args, "small"):
        for backend, ms in (("torch_cudnn", 0.0110), ("cuflash_cudnn", 0.0105), ("cuflash_cuda", 0.0150)):
            results.append(prefill.result_row(point, backend, median_ms=ms, reps=100, first_call_ms=120.0,
                                              host_us=6.5))
    return results


class SmallShapes(unittest.TestCase):
    def test_points(self):
        args = prefill.parse_args([])
        small = prefill.points(args, "small")
        self.assertEqual(len(small), 16)  # 2 passes x 2 head dims x 2 masks x S=128,512
        self.assertTrue(all(p["batch"] == 1 and p["heads"] == 16 and p["sweep"] == "small" for p in small))
        self.assertEqual(prefill.points(prefill.parse_args(["--no-small"]), "small"), [])

    def test_rows_stay_apart_and_get_their_own_section(self):
        rows = plot_prefill.merge_rows(fake_results() + fake_small_results(), META)
        self.assertEqual(len(rows), 72 + 16)
        small = [row for row in rows if plot_prefill.is_small(row)]
        self.assertEqual(len(small), 16)
        self.assertEqual(small[0]["host_us"]["cuflash_cudnn"], 6.5)
        self.assertEqual(small[0]["first_call_ms"]["torch_cudnn"], 120.0)
        text = plot_prefill.render_markdown(rows)
        self.assertIn("## Small problems (B=1, H=16): time per call, µs", text)
        # 10.5 µs against 11.0: torch_cudnn time / cuflash_cudnn time.
        self.assertIn("| fwd | 64 | none | 128 | 15.0 | 10.5 | 11.0 | 0.73 | 1.05 |", text)
        self.assertIn("6.50 / 120.000", text.replace("6.5 / 120.0", "6.50 / 120.000"))
        # The main tables and the shortfall list know nothing of them.
        main = text.split("## Small problems")[0]
        self.assertNotIn("| 128 | 1×16 |", main)
        with tempfile.TemporaryDirectory() as out:
            plot_prefill.write_report(rows, out)
            with open(os.path.join(out, "prefill.json")) as f:
                self.assertEqual(json.load(f), rows)

    def test_the_cudnn_target_lists_its_shortfalls(self):
        results = fake_results(with_failures=False)
        for row in [r for r in results if r["backend"] == "torch_cudnn"]:
            cudnn = dict(row, backend="cuflash_cudnn")
            factor = 0.95 if row["seqlen"] == 512 else 1.0
            cudnn["tflops"] = row["tflops"] * factor
            cudnn["median_ms"] = row["median_ms"] / factor
            results.append(cudnn)
        text = plot_prefill.render_markdown(plot_prefill.merge_rows(results, META))
        self.assertIn("## Points where cuflash_cudnn / torch_cudnn < 0.97", text)
        section = text.split("## Points where cuflash_cudnn / torch_cudnn < 0.97")[1].split("##")[0]
        self.assertEqual(section.count("S=512: 0.95"), 12)  # 3 D x 2 masks x 2 passes


class FlashAttention4Peer(unittest.TestCase):
    """The fa4 peer without a GPU: a bench object that never touches torch."""

    def bench(self):
        bench = object.__new__(prefill.TorchBench)
        bench.torch = bench.F = None
        return bench

    def test_fa4_is_a_backend_but_not_a_default(self):
        args = prefill.parse_args(["--backends", "cuflash_cuda,torch_cudnn,fa4"])
        self.assertEqual(args.backends, ["cuflash_cuda", "torch_cudnn", "fa4"])
        self.assertNotIn("fa4", prefill.DEFAULT_BACKENDS)

    def test_absent_package_gives_an_error_row(self):
        # None in sys.modules: `import flash_attn.cute` raises ImportError.
        with mock.patch.dict(sys.modules, {"flash_attn": None, "flash_attn.cute": None}):
            point = prefill.points(prefill.parse_args(["--head-dims", "128", "--seqlens", "512"]))[0]
            row = self.bench().measure(point, "fa4")
        self.assertIsNone(row["tflops"])
        self.assertIn("flash_attn.cute not importable", row["error"])
        self.assertEqual((row["backend"], row["head_dim"], row["seqlen"]), ("fa4", 128, 512))

    def test_fa4_gets_bshd_views_and_its_output_is_unpacked(self):
        class View:
            def __init__(self, name, swaps=0):
                self.name, self.swaps = name, swaps

            def transpose(self, a, b):
                assert (a, b) == (1, 2)
                return View(self.name, self.swaps + 1)

        calls = []

        def flash_attn_func(q, k, v, causal=False):
            calls.append((q.swaps, k.swaps, v.swaps, causal))
            return View("out"), View("lse")

        package, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
        cute.flash_attn_func = flash_attn_func
        package.cute = cute
        with mock.patch.dict(sys.modules, {"flash_attn": package, "flash_attn.cute": cute}):
            attention, _ = self.bench().attention("fa4")
            out = attention(View("q"), View("k"), View("v"), True)
        self.assertEqual(calls, [(1, 1, 1, True)])  # [B, H, S, D] views back to [B, S, H, D]
        self.assertEqual((out.name, out.swaps), ("out", 1))  # out, not (out, lse), as [B, H, S, D]

    def test_the_report_takes_ratios_against_fa4(self):
        results = fake_results(with_failures=False)
        results += [dict(r, backend="fa4") for r in results if r["backend"] == "torch_cudnn"]
        text = plot_prefill.render_markdown(plot_prefill.merge_rows(results, META))
        self.assertIn("cuflash_cuda / fa4", text)
        header = next(line for line in text.splitlines() if line.startswith("| D | mask"))
        self.assertLess(header.index("torch_efficient"), header.index("| fa4 |"))


class CuflashProcess(unittest.TestCase):
    def test_rows_from_a_fake_cuflash_and_missing_points(self):
        args = prefill.parse_args(["--passes", "fwd", "--head-dims", "64", "--seqlens", "512,1024"])
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "cuflash")
            row = dict(pass_="fwd", backend="cuda", head_dim=64, heads=32, batch=32, seqlen=512, causal=False,
                       dtype="bf16", device="Fake GPU", reps=10, median_ms=0.5, tflops=275.0, error=None)
            line = json.dumps(row).replace("pass_", "pass")
            write_fake_cuflash(fake, line)
            args.cuflash = fake
            results = prefill.run_cuflash(args, ["cuflash_cuda"])
        self.assertEqual(len(results), 4)  # 2 seqlens x 2 masks
        self.assertEqual(results[0]["backend"], "cuflash_cuda")
        self.assertEqual(results[0]["tflops"], 275.0)
        self.assertTrue(all("exit code 1" in r["error"] for r in results[1:]))

    def test_small_sweep_command(self):
        args = prefill.parse_args(["--passes", "fwd"])
        captured, results = captured_commands(lambda: prefill.run_cuflash(args, ["cuflash_cudnn"], "small"))
        command = " ".join(captured[0])
        self.assertIn("--batch 1 --heads 16 --seqlen 128,512", command)
        self.assertNotIn("--sweep", command)
        self.assertEqual(len(results), 8)
        self.assertTrue(all(r["sweep"] == "small" and r["tflops"] is None for r in results))

    def test_deterministic_backend_runs_its_own_fwdbwd_process(self):
        args = prefill.parse_args(["--passes", "fwd,fwdbwd", "--head-dims", "128", "--seqlens", "512"])
        captured, results = captured_commands(
            lambda: prefill.run_cuflash(args, ["cuflash_cuda", "cuflash_cuda_det", "cuflash_cudnn"]))
        self.assertEqual(len(captured), 2)
        default, ordered = (" ".join(c) for c in captured)
        self.assertIn("--backend cuda,cudnn --pass fwd,fwdbwd", default)
        self.assertNotIn("--deterministic", default)
        self.assertIn("--backend cuda --pass fwdbwd", ordered)
        self.assertTrue(ordered.endswith("--deterministic"))
        det = [r for r in results if r["backend"] == "cuflash_cuda_det"]
        self.assertEqual(sorted((r["pass"], r["causal"]) for r in det), [("fwdbwd", False), ("fwdbwd", True)])

    def test_the_deterministic_ratio_and_its_target(self):
        results = fake_results(with_failures=False)
        for row in [r for r in results if r["backend"] == "cuflash_cuda" and r["pass"] == "fwdbwd"]:
            factor = 0.8 if row["seqlen"] == 512 else 0.9
            results.append(dict(row, backend="cuflash_cuda_det", tflops=row["tflops"] * factor,
                                median_ms=row["median_ms"] / factor))
        text = plot_prefill.render_markdown(plot_prefill.merge_rows(results, META))
        self.assertIn("cuflash_cuda_det / cuflash_cuda |", text)
        section = text.split("## Points where cuflash_cuda_det / cuflash_cuda < 0.85")[1].split("##")[0]
        self.assertEqual(section.count("S=512: 0.80"), 6)  # 3 D x 2 masks, fwdbwd only

    def test_missing_command(self):
        args = prefill.parse_args(["--passes", "fwd", "--head-dims", "64", "--seqlens", "512", "--masks", "none",
                                   "--cuflash", "/nonexistent/cuflash"])
        results = prefill.run_cuflash(args, ["cuflash_cuda", "cuflash_cudnn"])
        self.assertEqual([r["backend"] for r in results], ["cuflash_cuda", "cuflash_cudnn"])
        self.assertTrue(all(r["tflops"] is None for r in results))

    @unittest.skipUnless(os.environ.get("CUFLASH_CLI"), "set CUFLASH_CLI to the cuflash command")
    def test_the_real_parser_accepts_the_command_line(self):
        args = prefill.parse_args([])
        captured, _ = captured_commands(lambda: prefill.run_cuflash(args, ["cuflash_cuda", "cuflash_cudnn"]))
        captured += captured_commands(lambda: prefill.run_cuflash(args, ["cuflash_cuda", "cuflash_cudnn"], "small"))[0]
        self.assertEqual(len(captured), 2)
        for sweep_command in captured:
            command = [os.environ["CUFLASH_CLI"]] + sweep_command[1:] + ["--help"]  # --help last: every flag parsed first
            done = subprocess.run(command, capture_output=True, text=True)
            self.assertEqual(done.returncode, 0, done.stderr)
        bad = subprocess.run([os.environ["CUFLASH_CLI"], "bench", "--rep-ms", "x"], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertEqual(bad.stderr.count("\n"), 1)


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


if __name__ == "__main__":
    unittest.main()
