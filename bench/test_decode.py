#!/usr/bin/env python3
"""Tests of bench/decode.py and bench/decode_report.py that need no GPU and no
PyTorch: merging (the torch peers' contiguous numbers entered in the paged
rows), the ratios, issue 5's acceptance checks, the markdown, rebuilding from
the json, and the `cuflash bench` command line that decode.py builds (checked
against the real parser when $CUFLASH_CLI names the command).

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_testing import captured_commands, write_fake_cuflash  # noqa: E402
import decode  # noqa: E402
import decode_report  # noqa: E402

META = dict(dtype="bf16", device="NVIDIA H100 80GB HBM3", date="2026-11-24T10:00Z", commit="abc1234",
            torch="2.11.0+cu130", copy_gbps=3000.0, copy_bytes=2 << 30, copy_ms=1.43, copy_reps=100)
# GB/s per backend; cuflash_cuda at 2850 (95% of copy) except where a test says otherwise.
FAKE_GBPS = {"cuflash_cuda": 2850.0, "cuflash_cudnn": 2600.0, "torch_flash": 2500.0, "torch_cudnn": 2700.0}


def ms_for(point: dict, gbps: float) -> float:
    return decode.kv_bytes(point["batch"], point["kv_len"], point["heads_kv"], point["head_dim"]) / (gbps * 1e9) * 1e3


def fake_results(args, slow=(), skip=()) -> list[dict]:
    """Rows as decode.py collects them; points in `slow` get cuflash_cuda at
    half speed, points in `skip` (batch, kv_len) are skipped for every backend."""
    results = []
    for point in decode.points(args):
        backends = ["cuflash_cuda", "cuflash_cudnn"] + (list(decode.TORCH_BACKENDS) if point["page_size"] == 0 else [])
        for backend in backends:
            if (point["batch"], point["kv_len"]) in skip:
                results.append(decode.result_row(point, backend, error="skipped: too large", skipped=True))
                continue
            gbps = FAKE_GBPS[backend] * (0.5 if backend == "cuflash_cuda" and
                                         (point["batch"], point["kv_len"]) in slow else 1.0)
            results.append(decode.result_row(point, backend, median_ms=ms_for(point, gbps), reps=20))
    return results


class MergeAndReport(unittest.TestCase):
    def setUp(self):
        self.args = decode.parse_args(["--batches", "1,8", "--kv-lens", "1024,4096", "--head-pairs", "32/8,32/32",
                                       "--page-sizes", "16,64"])

    def test_contiguous_peers_join_every_layout(self):
        self.assertEqual(self.args.page_sizes, [0, 16, 64])  # the peers' layout is added
        rows = decode_report.merge_rows(fake_results(self.args), META)
        self.assertEqual(len(rows), 2 * 3 * 2 * 2)
        for row in rows:
            for key in ("batch", "kv_len", "heads_q", "heads_kv", "head_dim", "page_size", "dtype", "device",
                        "copy_gbps", "gbps"):
                self.assertIn(key, row)
            self.assertEqual(set(row["gbps"]), set(decode_report.BACKENDS))
            self.assertAlmostEqual(row["gbps"]["torch_cudnn"], 2700.0, places=0)
            self.assertAlmostEqual(row["copy_fraction"], 0.95, places=3)
            self.assertEqual(row["best_peer"], "torch_cudnn")
            self.assertAlmostEqual(row["vs_best_peer"], 2850.0 / 2700.0, places=2)

    def test_acceptance_lists_the_misses(self):
        rows = decode_report.merge_rows(fake_results(self.args, slow={(8, 4096)}), META)
        acc = decode_report.acceptance(rows)
        # Paged rows at kv >= 4k: 2 head pairs x 2 pages x 2 batches.
        self.assertEqual(acc["points"], 8)
        self.assertEqual(acc["measured"], 8)
        self.assertEqual(len(acc["copy_misses"]), 4)
        self.assertEqual(len(acc["peer_misses"]), 4)
        self.assertTrue(all(r["batch"] == 8 for r in acc["peer_misses"]))
        self.assertEqual(len(acc["latency"]), 4)  # 2 head pairs x 2 pages at batch 1, kv 4k
        self.assertTrue(all(item["ok"] for item in acc["latency"]))
        text = decode_report.markdown(rows, META)
        self.assertIn("≥ 90% of copy bandwidth: 4 of 8", text)
        self.assertIn("32/8 page 16 B=8 kv=4096 (48%)", text)
        self.assertIn("## Hq/Hk = 32/32, page 64", text)
        self.assertIn("## Hq/Hk = 32/8, contiguous cache", text)

    def test_skips_and_failures_are_listed_not_counted(self):
        results = fake_results(self.args, skip={(8, 4096)})
        results.append(decode.result_row(dict(batch=1, kv_len=1024, heads_q=32, heads_kv=8, head_dim=128,
                                               page_size=16), "cuflash_cuda", error="unsupported: nope"))
        rows = decode_report.merge_rows(results, META)
        acc = decode_report.acceptance(rows)
        self.assertEqual(acc["measured"], 4)
        self.assertEqual(len(acc["unmeasured"]), 4)
        text = decode_report.markdown(rows, META)
        self.assertIn("## Skipped", text)
        self.assertIn("## Failures", text)
        self.assertIn("unsupported: nope", text)
        self.assertIn("| skip |", text)

    def test_expanded_peer_is_marked(self):
        results = fake_results(self.args)
        for r in results:
            if r["backend"] == "torch_cudnn" and r["heads_q"] != r["heads_kv"]:
                r["note"] = "K/V expanded to 32 heads"
        text = decode_report.markdown(decode_report.merge_rows(results, META), META)
        self.assertIn("## Notes", text)
        self.assertIn("2700*", text)

    def test_report_files_and_rebuild(self):
        rows = decode_report.merge_rows(fake_results(self.args), META)
        with tempfile.TemporaryDirectory() as out:
            decode_report.write_report(rows, META, out)
            with open(os.path.join(out, "decode.json")) as f:
                data = json.load(f)
            self.assertEqual(data["meta"]["copy_gbps"], 3000.0)
            with open(os.path.join(out, "decode.md")) as f:
                first = f.read()
            os.remove(os.path.join(out, "decode.md"))
            subprocess.run([sys.executable, os.path.join(HERE, "decode_report.py"), os.path.join(out, "decode.json")],
                           check=True)
            with open(os.path.join(out, "decode.md")) as f:
                self.assertEqual(f.read(), first)


class CuflashProcess(unittest.TestCase):
    def test_rows_from_a_fake_cuflash_and_missing_points(self):
        args = decode.parse_args(["--batches", "1", "--kv-lens", "4096,8192", "--head-pairs", "32/8",
                                  "--page-sizes", "16", "--backends", "cuflash_cuda"])
        self.assertEqual(args.page_sizes, [16])
        with tempfile.TemporaryDirectory() as tmp:
            fake = os.path.join(tmp, "cuflash")
            row = dict(sweep="decode", backend="cuda", batch=1, kv_len=4096, heads_q=32, heads_kv=8, head_dim=128,
                       page_size=16, q_len=1, causal=False, dtype="bf16", device="Fake GPU", kv_bytes=16777216,
                       skipped=False, reps=10, median_ms=0.0062, gbps=2706.0, first_call_ms=1.0, host_us=5.0,
                       error=None)
            write_fake_cuflash(fake, json.dumps(row))
            args.cuflash = fake
            results = decode.run_cuflash(args, ["cuflash_cuda"])
        self.assertEqual(len(results), 2)
        self.assertEqual(results[0]["backend"], "cuflash_cuda")
        self.assertAlmostEqual(results[0]["gbps"], 16777216 / 0.0062e-3 / 1e9, places=3)
        self.assertIn("exit code 1", results[1]["error"])

    def test_command_line(self):
        args = decode.parse_args([])
        captured, results = captured_commands(lambda: decode.run_cuflash(args, ["cuflash_cuda", "cuflash_cudnn"]))
        command = " ".join(captured[0])
        self.assertIn("--sweep decode --json --backend cuda,cudnn", command)
        self.assertIn("--gqa 32/8,32/32 --page-size 0,16,64 --batches 1,8,64,128", command)
        self.assertIn("--kv-len 1024,2048,4096,8192,16384,32768,65536,131072", command)
        self.assertEqual(len(results), 2 * 3 * 4 * 8 * 2)
        self.assertTrue(all(r["gbps"] is None for r in results))

    @unittest.skipUnless(os.environ.get("CUFLASH_CLI"), "set CUFLASH_CLI to the cuflash command")
    def test_the_real_parser_accepts_the_command_line(self):
        args = decode.parse_args([])
        captured, _ = captured_commands(lambda: decode.run_cuflash(args, ["cuflash_cuda", "cuflash_cudnn"]))
        command = [os.environ["CUFLASH_CLI"]] + captured[0][1:] + ["--help"]  # --help last: every flag parsed first
        done = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)


if __name__ == "__main__":
    unittest.main()
