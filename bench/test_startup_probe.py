#!/usr/bin/env python3
"""Tests of bench/startup_probe.py that need no GPU: the line fit, and the
probe's loop over batches, backends and flush modes against a fake
`cuflash bench --json` whose times are a known intercept plus a slope."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import startup_probe  # noqa: E402


class FitTest(unittest.TestCase):
    def test_exact_line(self):
        a, b = startup_probe.fit_line([8, 16, 32, 64], [0.015 + 0.004 * x for x in (8, 16, 32, 64)])
        self.assertAlmostEqual(a, 0.015)
        self.assertAlmostEqual(b, 0.004)

    def test_needs_two_distinct_batches(self):
        with self.assertRaises(ValueError):
            startup_probe.fit_line([8], [1.0])
        with self.assertRaises(ValueError):
            startup_probe.fit_line([8, 8], [1.0, 2.0])


class ProbeTest(unittest.TestCase):
    def test_rows_and_report_from_fake_bench(self):
        calls = []

        def run(cmd, log, on_object):  # bench_common.run_json_lines' part
            calls.append(cmd)
            batch = int(cmd[cmd.index("--batch") + 1])
            backend = cmd[cmd.index("--backend") + 1]
            flushed = "--no-flush-l2" not in cmd
            intercept = (0.018 if backend == "cuda" else 0.004) + (0.002 if flushed else 0.0)
            if backend == "cudnn" and batch == 64:
                return 1  # a failed point, no row: left out of the fit
            on_object({"median_ms": intercept + 0.004 * batch})
            return 0

        args = startup_probe.parse(["--cuflash", "cf", "--batches", "8,16,32,64"])
        rows = startup_probe.probe(args, run)
        self.assertEqual(len(calls), 16)  # 4 batches x 2 backends x 2 flush modes
        by = {(r["backend"], r["flush_l2"]): r for r in rows}
        self.assertAlmostEqual(by[("cuda", True)]["intercept_us"], 20.0)
        self.assertAlmostEqual(by[("cuda", False)]["intercept_us"], 18.0)
        self.assertAlmostEqual(by[("cudnn", True)]["intercept_us"], 6.0)
        self.assertEqual(by[("cudnn", True)]["batches"], [8, 16, 32])
        self.assertAlmostEqual(by[("cudnn", False)]["per_batch_us"], 4.0)
        text = startup_probe.report(args, rows)
        self.assertIn("| cuda | yes | 52.0 | 84.0 | 148.0 | 276.0 | 20.0 | 4.0 |", text)
        self.assertIn("| cudnn | no | 36.0 | 68.0 | 132.0 | — | 4.0 | 4.0 |", text)

    def test_a_failed_points_error_is_logged(self):
        def run(cmd, log, on_object):
            on_object({"median_ms": None, "error": "backend cudnn: not built (CUFLASH_ENABLE_CUDNN=OFF)"})
            return 1

        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            median = startup_probe.bench_median_ms("cf", "cudnn", 64, 512, 32, 8, "causal", True, run)
        self.assertIsNone(median)
        self.assertIn("cudnn B=8: backend cudnn: not built", err.getvalue())


if __name__ == "__main__":
    unittest.main()
