#!/usr/bin/env python3
"""Tests of bench/ring.py and bench/ring_report.py that need no GPU and no
PyTorch: the points, the mask arguments of the ring's local calls (the
schedule itself is tested in tests/cpu/ring_schedule_test.cpp), the FLOP count, the report (json, markdown,
plot when matplotlib is there) and the merge of two runs, from the command
line too. With torch installed, also that torch's head-tail load balancer
shards as cuflash's zigzag does.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ring  # noqa: E402
import ring_report  # noqa: E402


def global_positions(layout: str, world: int, rank: int, chunk_len: int) -> list[int]:
    """The global token positions a rank holds, in its local order."""
    return [chunk * chunk_len + t for chunk in ring.layout_chunks(layout, world, rank) for t in range(chunk_len)]


class CallOptions(unittest.TestCase):
    def test_the_schedule_s_masks_pass_through(self):
        self.assertEqual(ring.local_call_options(True, -1, -1, None), dict(causal=True, window_size=(-1, -1)))
        self.assertEqual(ring.local_call_options(False, -1, -1, None), dict(causal=False, window_size=(-1, -1)))
        with self.assertRaises(ValueError):
            ring.local_call_options(True, -1, -1, 5)  # cuflash.attention takes no diagonal_offset


class Points(unittest.TestCase):
    def test_default_and_quick(self):
        args = ring.parse_args([])
        full = ring.points(2, args.tokens_per_gpu, args.strong_seq_lens, args.passes, args.masks, 16, 128)
        self.assertEqual(len(full), (4 + 1) * 2 * 2)
        self.assertEqual([p["seq_len"] for p in full if p["scaling"] == "weak"][::4], [16384, 32768, 65536, 131072])
        strong = [p for p in full if p["scaling"] == "strong"]
        self.assertEqual({(p["seq_len"], p["tokens_per_gpu"]) for p in strong}, {(131072, 65536)})
        quick = ring.parse_args(["--quick"])
        self.assertEqual(quick.tokens_per_gpu, ring.QUICK_WEAK_TOKENS)
        self.assertEqual((quick.rep_ms, quick.min_reps), (0.0, 10))
        self.assertEqual(len(ring.points(1, quick.tokens_per_gpu, quick.strong_seq_lens, quick.passes, quick.masks,
                                         16, 128)), 3 * 4)
        self.assertTrue(all("invalid" not in p for p in full))

    def test_a_sequence_that_does_not_split(self):
        bad = ring.points(3, [], [131072], ["fwd"], ["causal"], 16, 128)
        self.assertIn("do not split", bad[0]["invalid"])
        self.assertEqual(len(ring.points(3, [], [131072], ["fwd"], ["causal"], 16, 128, layout="contiguous")), 1)

    def test_too_few_reps_refused(self):
        with self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            ring.parse_args(["--min-reps", "5"])

    def test_flops(self):
        self.assertEqual(ring_report.flops("fwd", 1024, 16, 128, False), 4.0 * 1024 * 1024 * 16 * 128)
        self.assertEqual(ring_report.flops("fwd_bwd", 1024, 16, 128, True), 3.5 * 2.0 * 1024 * 1024 * 16 * 128)


def fake_row(world: int, scaling: str, tokens: int, causal: bool, pass_name: str, ring_ms: float) -> dict:
    seq = tokens * world
    row = dict(scaling=scaling, tokens_per_gpu=tokens, seq_len=seq, world_size=world, causal=causal, batch=1,
               heads=16, head_dim=128, dtype="bf16", layout="zigzag", device="NVIDIA H200", date="2026-11-30T10:00Z",
               commit="abc1234", torch="2.11.0+cu130", **{"pass": pass_name})
    row["ms"] = {"cuflash_ring": ring_ms, "torch_cp_cudnn": ring_ms * 0.9,
                 "torch_cp_flash": None if causal else ring_ms * 1.3}
    row["baseline_ms"] = ring_ms * (1.0 if world == 1 else 0.9)
    row["comm_only_ms"] = ring_ms * 0.3 if world > 1 else None
    if causal:
        row["errors"] = {"torch_cp_flash": "RuntimeError: made up"}
    return ring_report.derive(row)


def fake_report(world: int) -> dict:
    rows = []
    for pass_name, causal in itertools.product(["fwd", "fwd_bwd"], [True, False]):
        scale = (0.5 if causal else 1.0) * (3.5 if pass_name == "fwd_bwd" else 1.0)
        for tokens in (8192, 32768):
            rows.append(fake_row(world, "weak", tokens, causal, pass_name, scale * world * (tokens / 8192) ** 2))
        rows.append(fake_row(world, "strong", 131072 // world, causal, pass_name, scale * 256 / world))
    meta = dict(device="NVIDIA H200", gpus=f"{world} × NVIDIA H200", world_size=world, date="2026-11-30T10:00Z",
                commit="abc1234", torch="2.11.0+cu130", nccl="2.27.7", dtype="bf16", heads=16, head_dim=128,
                layout="zigzag", torch_cp_note="made up", env={"NCCL_NVLS_ENABLE": "0"})
    checks = [dict(world_size=world, seq_len=8192 * world, causal=True, backend="cuflash_ring",
                   max_abs_error=dict(out=0.0039, dq=0.0078, dk=0.0078, dv=0.0039), max_abs_ref=2.5, error=None),
              dict(world_size=world, seq_len=8192 * world, causal=True, backend="torch_cp_flash", max_abs_error=None,
                   max_abs_ref=2.5, error="RuntimeError: made up")]
    return dict(meta=meta, rows=rows, checks=checks)


class Report(unittest.TestCase):
    def test_derived_fields(self):
        row = fake_row(2, "weak", 8192, False, "fwd", 10.0)
        flops = 4.0 * 16384 ** 2 * 16 * 128
        self.assertAlmostEqual(row["tflops_per_gpu"]["cuflash_ring"], round(flops / 2 / 0.010 / 1e12, 2))
        self.assertEqual(row["tokens_per_s_per_gpu"]["cuflash_ring"], 819200)
        self.assertAlmostEqual(row["efficiency"], 0.9)
        self.assertAlmostEqual(row["comm_hidden"], 1 - (10.0 - 9.0) / 3.0, places=4)
        self.assertIsNone(fake_row(1, "weak", 8192, False, "fwd", 10.0)["comm_hidden"])
        for key in ("world_size", "tokens_per_gpu", "seq_len", "causal", "head_dim", "heads", "pass", "scaling", "ms",
                    "baseline_ms", "efficiency", "comm_hidden", "tflops_per_gpu"):
            self.assertIn(key, row)

    def test_merge_and_markdown(self):
        merged = ring_report.merge_reports([fake_report(1), fake_report(2)])
        self.assertEqual(len(merged["rows"]), 24)
        self.assertEqual(merged["meta"]["world_sizes"], [1, 2])
        self.assertEqual(merged["meta"]["device"], "NVIDIA H200")
        # A later report replaces an earlier one's row of the same key.
        again = ring_report.merge_reports([fake_report(2), fake_report(2)])
        self.assertEqual(len(again["rows"]), 12)
        text = ring_report.render_markdown(merged)
        self.assertIn("## Measured", text)
        self.assertIn("### Weak scaling", text)
        self.assertIn("### Strong scaling", text)
        self.assertIn("speedup vs W=1", text)
        self.assertIn("## Correctness spot check", text)
        self.assertIn("## Failed or skipped", text)
        self.assertIn("RuntimeError: made up", text)
        # W=1 strong forward non-causal 256 ms, W=2 128 ms: speedup 2.00, efficiency 1.00.
        strong = [line for line in text.splitlines() if line.startswith("| 2 | 64k | 128k | none |")]
        self.assertTrue(strong and strong[0].rstrip(" |").endswith("2.00 | 1.00"), strong)

    def test_written_files_and_merge_command(self):
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for world in (1, 2):
                out = os.path.join(tmp, f"w{world}")
                ring_report.write_report(fake_report(world), out, plot=False)
                paths.append(os.path.join(out, "ring.json"))
                with open(paths[-1]) as f:
                    self.assertEqual(len(json.load(f)["rows"]), 12)
            merged = os.path.join(tmp, "merged")
            result = subprocess.run([sys.executable, os.path.join(HERE, "ring.py"), "--merge", *paths,
                                     "--out-dir", merged], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)
            with open(os.path.join(merged, "ring.json")) as f:
                report = json.load(f)
            self.assertEqual(len(report["rows"]), 24)
            self.assertEqual(len(report["checks"]), 4)
            with open(os.path.join(merged, "ring.md")) as f:
                self.assertIn("run with W=2", f.read())
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                return
            self.assertTrue(os.path.getsize(os.path.join(merged, "ring.png")) > 10000)
            result = subprocess.run([sys.executable, os.path.join(HERE, "ring_report.py"),
                                     os.path.join(merged, "ring.json")], capture_output=True, text=True)
            self.assertEqual(result.returncode, 0, result.stderr)

    def test_merge_refuses_other_json(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "prefill.json")
            with open(path, "w") as f:
                json.dump([{"pass": "fwd"}], f)
            result = subprocess.run([sys.executable, os.path.join(HERE, "ring.py"), "--merge", path, "--out-dir", tmp],
                                    capture_output=True, text=True)
            self.assertEqual(result.returncode, 1)
            self.assertIn("not a ring.json", result.stderr)


class TorchLoadBalancer(unittest.TestCase):
    def test_head_tail_is_zigzag(self):
        try:
            from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer
        except ImportError:
            self.skipTest("no torch (or no context parallel in it)")
        for world in (1, 2, 4):
            chunk_len, seq = 3, 2 * world * 3
            order = _HeadTailLoadBalancer(seq, world, "cpu")._generate_indices()[0].tolist()
            ours = [p for rank in range(world) for p in global_positions("zigzag", world, rank, chunk_len)]
            self.assertEqual(order, ours)


if __name__ == "__main__":
    unittest.main()
