#!/usr/bin/env python3
"""Tests of bench/step_timeline.py that need no GPU: a timeline file written
here in the layout sm90/step_timeline.cuh dumps (a header of 8 ints, then
kTimelineCtas x kTimelineWarpgroups rows of (event << 56 | clock) words),
read back in the per-stamp form (--raw) and as the medians of the phases.

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import step_timeline  # noqa: E402

EVENT = {name: code for code, name in step_timeline.EVENTS.items()}


def write_timeline(path, stamps, entries=16, spans=None):
    """stamps: {(cta, warpgroup): [(event name, clock), ...]}; spans: a list of
    (start_ns, end_ns, start_clock, end_clock, smid) ("TL01") or those and
    longest_wait ("TL02"), written after the rows."""
    rows = step_timeline.CTAS * step_timeline.WARPGROUPS
    magic = 0x544C3032 if spans and len(spans[0]) == 6 else 0x544C3031
    header = struct.pack("8i", magic, 128, 2, 2, 16, 16, rows, entries)
    words = [[0] * entries for _ in range(rows)]
    for (cta, wg), row in stamps.items():
        for k, (event, clock) in enumerate(row):
            words[cta * step_timeline.WARPGROUPS + wg][k] = EVENT[event] << 56 | clock
    with open(path, "wb") as f:
        f.write(header + b"".join(struct.pack(f"{entries}Q", *w) for w in words))
        if spans is not None:
            f.write(struct.pack("i", len(spans)) + b"".join(struct.pack(f"{len(s)}Q", *s) for s in spans))


class StepTimelineTest(unittest.TestCase):
    def run_main(self, *args):
        out = io.StringIO()
        argv = sys.argv
        sys.argv = ["step_timeline.py", *args]
        try:
            with contextlib.redirect_stdout(out):
                step_timeline.main()
        finally:
            sys.argv = argv
        return out.getvalue()

    def test_raw_prints_each_stamp_from_the_ctas_first(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 0): [("start", 1000), ("load_q", 1100)],
                                  (0, 1): [("start", 1005), ("item", 3000), ("epilogue", 9000)],
                                  (1, 2): [("start", 50), ("item", 80)]})
            text = self.run_main("--raw", path)
        self.assertIn("CTA 0:", text)
        self.assertIn("producer: start 0, load_q 100", text)
        self.assertIn("consumer 0: start 5, item 2000, epilogue 8000", text)
        self.assertIn("CTA 1:", text)
        self.assertIn("consumer 1: start 0, item 30", text)

    def test_medians_skip_the_first_and_last_items(self):
        # Four items of one step each on consumer 0: the middle two count.
        row, clock = [], 0
        for length in (100, 200, 300, 400):
            row.append(("item", clock))
            for event in ("loads", "turn", "S", "softmax", "step"):
                clock += length // 5
                row.append((event, clock))
            clock += 10
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 1): row}, entries=32)
            text = self.run_main(path)
        self.assertIn("consumer 0:", text)
        self.assertIn("clocks 250", text)  # the median of the items of 200 and 300 clocks


class ProducerWaitTest(unittest.TestCase):
    def test_longest_gap_and_its_place(self):
        producer = [EVENT[e] << 56 | c for e, c in (("start", 100), ("load_q", 300), ("load_k", 400),
                                                     ("load_q", 600), ("load_k", 5600), ("end", 6100))]
        self.assertEqual(step_timeline.longest_producer_wait(producer), (5000, "load_q", "load_k", 500, 6000))
        self.assertIsNone(step_timeline.longest_producer_wait([EVENT["start"] << 56 | 5, 0]))

    def test_slot_waits(self):
        producer = [EVENT[e] << 56 | c for e, c in (
            ("start", 0), ("k_wait", 100), ("k_free", 150), ("k_armed", 200), ("load_k", 300), ("load_v", 2300),
            ("k_wait", 2400), ("k_free", 3400), ("k_armed", 3450), ("load_k", 3500), ("load_v", 3600), ("end", 4000))]
        self.assertEqual(step_timeline.slot_waits(producer), ([50, 1000], [2000, 100]))
        rows = [producer] + [[0]] * (step_timeline.CTAS * step_timeline.WARPGROUPS - 1)
        line = step_timeline.slot_wait_line({"ctas": 1}, rows)
        self.assertIn("over 2 tiles: K median 525, p90 1000, under 400: 50 %; V median 1050, p90 2000, under 400: 50 %",
                      line)

    def test_longest_waits_read_back_and_summarized(self):
        def packed(clocks, start, which, kv):
            return clocks << 40 | start << 16 | which << 15 | kv
        spans = [(0, 100, 0, 1000, sm, w) for sm, w in
                 enumerate([packed(20000, 9000, 1, 4), packed(18000, 8000, 1, 5), packed(2500, 100, 0, 1), 0])]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 0): [("start", 0), ("end", 10)]}, spans=spans)
            meta, _ = step_timeline.read(path)
        self.assertEqual(step_timeline.unpack_wait(meta["spans"][0]["longest_wait"]), (20000, 9000, "drain", 4))
        self.assertIsNone(step_timeline.unpack_wait(0))
        self.assertEqual(step_timeline.long_wait_line(meta["spans"]),
                         "  consumers' longest wait for data: 2 of 4 CTAs waited 5000+ clocks once; those: median "
                         "19000 clocks, starting 8500 clocks into the walk (min 8000, max 9000), at tile 4 (median), "
                         "drain 2")
        self.assertIsNone(step_timeline.long_wait_line([{"start_ns": 0}]))

    def test_summary_line(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 0): [("start", 0), ("load_q", 100), ("load_k", 1100), ("end", 2000)]})
            text = StepTimelineTest.run_main(StepTimelineTest(), path)
        self.assertIn("producer, CTA 0: longest wait 1000 clocks (load_q at 100 -> load_k), 50.0 % of its 2000 clocks",
                      text)


class SpanTest(unittest.TestCase):
    def test_spans_read_back_and_summarized(self):
        # Four CTAs from t = 1000 ns: ends at 101, 101, 121 and 121 us after
        # the first start; the mean end (111) is 8.3 % before the last (121).
        spans = [(1000, 102000, 10, 200010, 3), (2000, 102000, 20, 200020, 7),
                 (1000, 122000, 30, 240030, 11), (1000, 122000, 40, 240040, 12)]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 1): [("start", 0), ("item", 10)]}, spans=spans)
            read = step_timeline.read(path)[0]["spans"]
            text = StepTimelineTest.run_main(StepTimelineTest(), path)
        self.assertEqual(read[1], {"start_ns": 2000, "end_ns": 102000, "start_clock": 20, "end_clock": 200020,
                                   "smid": 7})
        self.assertIn("CTAs (4): walk clocks min 200000, median 220000, max 240000; "
                      "end us min 101.0, median 111.0, max 121.0; ended at the mean end: 8.3 % sooner", text)

    def test_stamping_ctas_left_out_of_the_spread(self):
        # Six CTAs; the first four (the stamping ones) walk 300000 clocks,
        # the other two 200000 and end at 100 and 110 us.
        slow = [(0, 150000, 0, 300000, i) for i in range(4)]
        spans = slow + [(0, 100000, 0, 200000, 20), (0, 110000, 0, 200000, 21)]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 1): [("start", 0), ("item", 10)]}, spans=spans)
            text = StepTimelineTest.run_main(StepTimelineTest(), path)
        self.assertIn("CTAs (2, without stamps): walk clocks min 200000, median 200000, max 200000; "
                      "end us min 100.0, median 105.0, max 110.0; ended at the mean end: 4.5 % sooner; "
                      "last SMs [21, 20]; the 4 stamping CTAs' walks median 300000 clocks (1.50 x)", text)

    def test_files_without_spans(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.bin")
            write_timeline(path, {(0, 1): [("start", 0)]})
            self.assertIsNone(step_timeline.read(path)[0]["spans"])
            self.assertNotIn("CTAs (", StepTimelineTest.run_main(StepTimelineTest(), path))


class QLeadTest(unittest.TestCase):
    def test_next_q_against_the_previous_items_end(self):
        # Producer issues Q for items 0..2 at 0, 500 and 2500; the consumer
        # ends item 0 at 1000 and item 1 at 2000, and starts item 1 at 1100
        # and item 2 at 2700: item 1's Q came 500 early (waited 100), item
        # 2's 500 late (waited 700).
        producer = [EVENT["load_q"] << 56 | c for c in (0, 500, 2500)]
        consumer = [EVENT[e] << 56 | c for e, c in (("item", 10), ("epilogue", 1000), ("item", 1100),
                                                     ("epilogue", 2000), ("item", 2700), ("epilogue", 3000))]
        leads, waits = step_timeline.q_lead(producer, consumer)
        self.assertEqual(leads, [500, -500])
        self.assertEqual(waits, [100, 700])

    def test_last_v_against_the_drain_turn(self):
        # Item 0 has two key tiles, item 1 one: the producer issues V for
        # tiles 0..2 at 100, 400 and 1500. Item 0's last step ends at 900
        # and its drain turn comes at 1000 (V 600 before it, a 100 wait);
        # item 1's step ends at 1800 and its turn at 2100 (V 600 before,
        # waited 300). A third item, past the producer's stamps, is left out.
        producer = [EVENT["load_v"] << 56 | c for c in (100, 400, 1500)]
        step = ("loads", "turn", "S", "softmax", "step")
        item0 = [("item", 0)] + [(e, 200 + 50 * k) for k, e in enumerate(step)] + \
            [(e, 600 + 75 * k) for k, e in enumerate(step)] + [("drain_turn", 1000), ("epilogue", 1200)]
        item1 = [("item", 1300)] + [(e, 1600 + 50 * k) for k, e in enumerate(step)] + \
            [("drain_turn", 2100), ("epilogue", 2300)]
        item2 = [("item", 2400)] + [(e, 2500 + 10 * k) for k, e in enumerate(step)] + [("drain_turn", 2700)]
        consumer = [EVENT[e] << 56 | c for e, c in item0 + item1 + item2]
        leads, waits = step_timeline.last_v_lead(producer, consumer)
        self.assertEqual(leads, [600, 600])
        self.assertEqual(waits, [100, 300])


if __name__ == "__main__":
    unittest.main()
