#!/usr/bin/env python3
"""Tests of bench/bench_common.py's timing loop for the PyTorch peers, on a
stand-in for torch (no GPU): where the GPU is made to spin before a timed call.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import os
import sys
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_common  # noqa: E402


class QueueLeadSpinTest(unittest.TestCase):
    def test_first_call_gets_twice_the_host_time(self):
        self.assertEqual(bench_common.queue_lead_spin_us(100.0, 5000.0, first=True), 220.0)

    def test_gpu_bound_calls_run_back_to_back(self):
        # A 3 ms forward+backward launched in 250 us: the host stays ahead.
        self.assertEqual(bench_common.queue_lead_spin_us(250.0, 3000.0, first=False), 0.0)

    def test_host_bound_calls_get_the_missing_lead(self):
        # A 30 us call launched in 200 us: the GPU waits out what the call's
        # own time does not cover, and more than the launch's excess.
        spin = bench_common.queue_lead_spin_us(200.0, 30.0, first=False)
        self.assertEqual(spin, 390.0)
        self.assertGreater(spin, 200.0 - 30.0)


class FakeEvent:
    def __init__(self, log, ms):
        self.log, self.ms = log, ms

    def record(self):
        self.log.append("event")

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return self.ms


def fake_timer(call_ms: float, rep_ms: float) -> tuple[bench_common.TorchTimer, list]:
    log: list = []
    cuda = types.SimpleNamespace(
        Event=lambda enable_timing=True: FakeEvent(log, call_ms),
        _sleep=lambda cycles: log.append(("sleep", cycles)),
        synchronize=lambda: None)
    timer = object.__new__(bench_common.TorchTimer)  # no torch: the fields time_calls reads
    timer.torch = types.SimpleNamespace(cuda=cuda)
    timer.args = types.SimpleNamespace(warmup_ms=0.0, rep_ms=rep_ms, min_reps=4, max_reps=1000)
    timer.flush_buffer = types.SimpleNamespace(zero_=lambda: log.append("flush"))
    timer.spin_cycles_per_us = 1000.0
    return timer, log


class TimeCallsTest(unittest.TestCase):
    def test_long_calls_spin_only_before_the_first(self):
        # A 3 ms call (host time ~0 here): one spin, before the first timed call.
        timer, log = fake_timer(call_ms=3.0, rep_ms=30.0)
        median_ms, reps, _ = timer.time_calls(lambda: log.append("call"), lambda: None)
        self.assertEqual((median_ms, reps), (3.0, 10))
        sleeps = [e for e in log if isinstance(e, tuple)]
        self.assertEqual(len(sleeps), 1)
        calls = [i for i, e in enumerate(log) if e == "call"]
        first_timed = calls[-reps]
        self.assertLess(log.index(sleeps[0]), first_timed)

    def test_short_calls_spin_before_each(self):
        # A 1 us call: the host (however quick here) cannot stay ahead of it.
        timer, log = fake_timer(call_ms=0.001, rep_ms=0.01)
        _, reps, _ = timer.time_calls(lambda: log.append("call"), lambda: None)
        sleeps = [e for e in log if isinstance(e, tuple)]
        self.assertEqual(len(sleeps), reps)


if __name__ == "__main__":
    unittest.main()
