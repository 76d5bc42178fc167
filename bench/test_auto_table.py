#!/usr/bin/env python3
"""Tests of bench/make_auto_table.py: which backend a point gets, backward
times from fwdbwd - fwd, and that the checked-in src/core/auto_table_data.inc
is what docs/perf/prefill.json gives.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_auto_table  # noqa: E402


def row(pass_name: str, seqlen: int, cuda_ms, cudnn_ms=None, batch: int = 8) -> dict:
    median = {"cuflash_cuda": cuda_ms, "torch_cudnn": 1.0}
    if cudnn_ms is not None:
        median["cuflash_cudnn"] = cudnn_ms
    return {"pass": pass_name, "head_dim": 128, "causal": True, "seqlen": seqlen, "batch": batch, "heads": 16,
            "dtype": "bf16", "device": "Fake GPU", "median_ms": median, "date": "2026-11-23T10:00Z", "commit": "abc"}


class Choice(unittest.TestCase):
    def test_margin(self):
        self.assertEqual(make_auto_table.choose(1.0, 0.9, 0.02), "cudnn")
        self.assertEqual(make_auto_table.choose(1.0, 0.99, 0.02), "cuda")  # within noise: our own kernel
        self.assertEqual(make_auto_table.choose(1.0, None, 0.02), "cuda")
        self.assertEqual(make_auto_table.choose(None, 0.5, 0.02), "cudnn")

    def test_backward_is_fwdbwd_minus_fwd(self):
        rows = [row("fwd", 2048, 1.0, 0.6), row("fwdbwd", 2048, 3.0, 3.2)]
        entries = make_auto_table.entries(rows, 0.02)
        self.assertEqual([(e[0], e[6]) for e in entries], [("forward", "cudnn"), ("backward", "cuda")])
        self.assertAlmostEqual(entries[1][7], 2.0)  # cuda backward 3.0 - 1.0
        self.assertAlmostEqual(entries[1][8], 2.6)  # cudnn backward 3.2 - 0.6
        self.assertEqual(entries[0][4], 8 * 2048)   # tokens

    def test_render_and_check(self):
        rows = [row("fwd", 512, 0.3, 0.2), row("fwd", 128, 0.02, None, batch=1)]
        text = make_auto_table.render(rows, "fake.json", 0.02)
        self.assertIn("{Pass::forward, 128, true, 128, 128, DType::bf16, Backend::cuda},  // 0.02 / -", text)
        self.assertIn("{Pass::forward, 128, true, 512, 4096, DType::bf16, Backend::cudnn},", text)
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "table.inc")
            self.assertEqual(make_auto_table.main([os.path.join(HERE, "..", "docs", "perf", "prefill.json"),
                                                   "--out", out]), 0)
            self.assertEqual(make_auto_table.main([os.path.join(HERE, "..", "docs", "perf", "prefill.json"),
                                                   "--out", out, "--check"]), 0)

    def test_checked_in_table_matches_the_json(self):
        self.assertEqual(make_auto_table.main(["--check"]), 0,
                         "src/core/auto_table_data.inc is stale: run python3 bench/make_auto_table.py")


if __name__ == "__main__":
    unittest.main()
