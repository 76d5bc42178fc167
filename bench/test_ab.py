#!/usr/bin/env python3
"""Tests of bench/ab.py that need no GPU and no PyTorch: fake `cuflash`
builds whose rounds differ, the median of the rounds, the spread, the ratio,
a failed point, several changes against one base, the report; and the `cuflash bench` command line ab.py builds
(checked against the real parser when $CUFLASH_CLI names the command).

    python3 -m unittest discover -s bench -p 'test_*.py'
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_testing import captured_commands  # noqa: E402
import ab  # noqa: E402


def write_fake_build(path: str, tflops_by_round: list[float], fail_seqlen: int | None = None) -> None:
    """A `cuflash` whose n-th run prints every requested point at
    tflops_by_round[n] (a counter file beside it counts the runs); the point
    at fail_seqlen, if any, prints an error row."""
    script = textwrap.dedent(f"""\
        #!/usr/bin/env python3
        import json, os, sys
        counter = {path!r} + ".runs"
        n = int(open(counter).read()) if os.path.exists(counter) else 0
        open(counter, "w").write(str(n + 1))
        a = sys.argv[1:]
        get = lambda flag: a[a.index(flag) + 1]
        for p in get("--pass").split(","):
            for d in map(int, get("--head-dim").split(",")):
                for m in get("--mask").split(","):
                    for s in map(int, get("--seqlen").split(",")):
                        row = {{"pass": p, "backend": "cuda", "head_dim": d, "seqlen": s, "causal": m == "causal"}}
                        if s == {fail_seqlen!r}:
                            row.update(error="out of memory", tflops=0.0)
                        else:
                            row["tflops"] = {tflops_by_round!r}[n]
                        print(json.dumps(row))
        """)
    with open(path, "w") as f:
        f.write(script)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


class AbTest(unittest.TestCase):
    def run_ab(self, base_rounds, change_rounds, fail_seqlen=None, rounds=3):
        tmp = tempfile.mkdtemp()
        base, change = os.path.join(tmp, "base"), os.path.join(tmp, "change")
        write_fake_build(base, base_rounds)
        write_fake_build(change, change_rounds, fail_seqlen)
        out = os.path.join(tmp, "out")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = ab.main(["--base", base, "--change", change, "--rounds", str(rounds), "--no-peers",
                            "--head-dims", "64", "--masks", "none", "--seqlens", "512,4096", "--out-dir", out])
        self.assertEqual(code, 0)
        with open(os.path.join(out, "ab.json")) as f:
            data = json.load(f)
        with open(os.path.join(out, "ab.md")) as f:
            markdown = f.read()
        return data, markdown

    def test_median_of_rounds_spread_and_ratio(self):
        data, markdown = self.run_ab([400.0, 404.0, 420.0], [440.0, 436.0, 444.0])
        self.assertEqual(data["meta"]["rounds"], 3)
        point = data["points"][0]
        self.assertEqual((point["head_dim"], point["causal"], point["seqlen"]), (64, False, 512))
        self.assertEqual(point["base"], 404.0)  # median of 400, 404, 420
        self.assertEqual(point["change"], 440.0)
        self.assertAlmostEqual(point["base_spread"], 420.0 / 400.0)
        self.assertAlmostEqual(point["change_over_base"], 440.0 / 404.0)
        self.assertIn("| fwd | 64 | none | 512 | 404.0 | 440.0 | 1.089 | 1.050 | 1.018 |", markdown)
        self.assertIn("Geometric mean of change / base: 1.089 over 2 points.", markdown)

    def test_a_failed_point_has_no_ratio_and_is_not_averaged(self):
        data, markdown = self.run_ab([400.0, 400.0], [500.0, 500.0], fail_seqlen=4096, rounds=2)
        failed = data["points"][1]
        self.assertEqual(failed["seqlen"], 4096)
        self.assertIsNone(failed["change"])
        self.assertIsNone(failed["change_over_base"])
        self.assertIn("| fwd | 64 | none | 4096 | 400.0 | — | — |", markdown)
        self.assertIn("over 1 points.", markdown)

    def test_several_changes_against_one_base(self):
        tmp = tempfile.mkdtemp()
        paths = {name: os.path.join(tmp, name) for name in ("base", "first", "second")}
        write_fake_build(paths["base"], [400.0, 400.0])
        write_fake_build(paths["first"], [440.0, 440.0])
        write_fake_build(paths["second"], [380.0, 390.0])
        out = os.path.join(tmp, "out")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = ab.main(["--base", paths["base"], "--change", paths["first"], "--change", paths["second"],
                            "--label-change", "fma4", "--rounds", "2", "--no-peers", "--head-dims", "64",
                            "--masks", "none", "--seqlens", "512", "--out-dir", out])
        self.assertEqual(code, 0)
        with open(os.path.join(out, "ab.json")) as f:
            data = json.load(f)
        with open(os.path.join(out, "ab.md")) as f:
            markdown = f.read()
        point = data["points"][0]
        self.assertEqual((point["base"], point["change"], point["change2"]), (400.0, 440.0, 385.0))
        self.assertAlmostEqual(point["change2_over_base"], 385.0 / 400.0)
        self.assertEqual(data["meta"]["labels"], {"base": "base", "change": "fma4", "change2": "change2"})
        self.assertIn("# A/B: fma4, change2 against base", markdown)
        self.assertIn("| fwd | 64 | none | 512 | 400.0 | 440.0 | 1.100 | 385.0 | 0.963 | 1.000 | 1.000 | 1.026 |",
                      markdown)
        self.assertIn("Geometric mean of change2 / base: 0.963 over 1 points.", markdown)

    def test_the_small_sweep_times_one_sequence_of_16_heads(self):
        args = ab.parse_args(["--base", "b", "--change", "c", "--no-peers", "--sweep", "small",
                              "--head-dims", "64,128,256", "--seqlens", "128,512"])
        captured, _ = captured_commands(lambda: ab.run_build(args, "cuflash"))
        command = captured[0]
        get = lambda flag: command[command.index(flag) + 1]
        self.assertNotIn("--sweep", command)
        self.assertEqual((get("--batch"), get("--heads"), get("--seqlen")), ("1", "16", "128,512"))
        self.assertEqual(get("--head-dim"), "64,128")  # the small shapes' head dims only
        points = ab.prefill.points(args, args.sweep)
        self.assertEqual({(p["batch"], p["heads"], p["seqlen"]) for p in points}, {(1, 16, 128), (1, 16, 512)})

    def test_the_small_sweep_takes_another_batch_and_heads(self):
        args = ab.parse_args(["--base", "b", "--change", "c", "--no-peers", "--sweep", "small",
                              "--head-dims", "64", "--seqlens", "2048", "--batch", "4", "--heads", "32"])
        captured, _ = captured_commands(lambda: ab.run_build(args, "cuflash"))
        command = captured[0]
        get = lambda flag: command[command.index(flag) + 1]
        self.assertEqual((get("--batch"), get("--heads"), get("--seqlen")), ("4", "32", "2048"))
        points = ab.prefill.points(args, args.sweep)
        self.assertEqual({(p["batch"], p["heads"], p["seqlen"]) for p in points}, {(4, 32, 2048)})
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            ab.parse_args(["--base", "b", "--change", "c", "--batch", "4"])  # the prefill sweep has its own shapes

    def test_more_labels_than_changes_is_refused(self):
        with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit):
            ab.parse_args(["--base", "b", "--change", "c", "--label-change", "x", "--label-change", "y"])

    @unittest.skipUnless(os.environ.get("CUFLASH_CLI"), "set CUFLASH_CLI to the cuflash command")
    def test_the_real_parser_accepts_the_command_line(self):
        args = ab.parse_args(["--base", "b", "--change", "c", "--no-peers"])
        captured, _ = captured_commands(lambda: ab.run_build(args, os.environ["CUFLASH_CLI"]))
        self.assertEqual(len(captured), 1)
        command = captured[0] + ["--help"]  # --help last: every flag parsed first
        done = subprocess.run(command, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)


if __name__ == "__main__":
    unittest.main()
