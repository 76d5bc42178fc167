#!/usr/bin/env python3
"""Splits a short call's time into a per-call part and a per-item part: times
one forward shape at several batch sizes with `cuflash bench` (backends cuda
and cudnn, with and without the L2 overwritten before each call) and fits
time = intercept + slope x batch per backend and flush mode.

Why (session 44): the TMA forward's step timeline at D = 64, 512 keys showed
the producer waiting ~30,000 clocks (~8-10 % of the kernel) once, at its
ring's first wrap, in every recorded CTA; the medians of
bench/step_timeline.py leave such a one-off wait out. A fixed cost of that
size would show here as an intercept well above cuDNN's, where a stamp
artifact of the timeline build would not; a cost that comes from the dirty
L2 the flush leaves behind would shrink without the flush.

    python3 bench/startup_probe.py --cuflash build/bin/cuflash --head-dim 64 --seqlen 512 --mask causal \\
        --heads 32 --batches 8,16,32,64 [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from bench_common import int_list, run_json_lines


def fit_line(xs, ys):
    """Least squares y = a + b x; returns (a, b)."""
    n = len(xs)
    if n < 2:
        raise ValueError("a line needs two points or more")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("the batches must differ")
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def bench_median_ms(cuflash, backend, head_dim, seqlen, heads, batch, mask, flush, run=run_json_lines):
    """One point's median ms from `cuflash bench --json` (None when the point failed)."""
    cmd = [cuflash, "bench", "--json", "--backend", backend, "--pass", "fwd", "--head-dim", str(head_dim),
           "--seqlen", str(seqlen), "--heads", str(heads), "--batch", str(batch), "--mask", mask]
    if not flush:
        cmd.append("--no-flush-l2")
    rows = []
    log = lambda message: print(f"startup_probe: {message}", file=sys.stderr)
    run(cmd, log, rows.append)
    if rows and rows[0].get("error"):
        # Say why: session 45's cudnn rows were empty because the A/B packs
        # are built without cuDNN, and only the exit code reached the log.
        log(f"{backend} B={batch}: {rows[0]['error']}")
    return rows[0].get("median_ms") if rows else None


def probe(args, run=run_json_lines):
    rows = []
    for flush in (True, False):
        for backend in args.backends:
            times = [bench_median_ms(args.cuflash, backend, args.head_dim, args.seqlen, args.heads, b, args.mask,
                                     flush, run) for b in args.batches]
            points = [(b, t) for b, t in zip(args.batches, times) if t is not None]
            row = {"backend": backend, "flush_l2": flush, "batches": [b for b, _ in points],
                   "median_ms": [t for _, t in points]}
            if len(points) >= 2:
                a, s = fit_line([b for b, _ in points], [t for _, t in points])
                row["intercept_us"], row["per_batch_us"] = a * 1e3, s * 1e3
            rows.append(row)
    return rows


def report(args, rows):
    lines = [f"# Start-up probe: forward D = {args.head_dim}, {args.mask}, {args.seqlen} keys, {args.heads} heads",
             "", "time = intercept + per_batch x batch (least squares over the batches)", "",
             "| backend | L2 flushed | " + " | ".join(f"B={b} us" for b in args.batches) +
             " | intercept us | per batch us |",
             "| --- | --- | " + " | ".join("---:" for _ in args.batches) + " | ---: | ---: |"]
    for row in rows:
        by_batch = dict(zip(row["batches"], row["median_ms"]))
        cells = [f"{by_batch[b] * 1e3:.1f}" if b in by_batch else "—" for b in args.batches]
        fit = [f"{row[k]:.1f}" if k in row else "—" for k in ("intercept_us", "per_batch_us")]
        lines.append(f"| {row['backend']} | {'yes' if row['flush_l2'] else 'no'} | " + " | ".join(cells + fit) + " |")
    return "\n".join(lines)


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cuflash", required=True, help="the cuflash command-line tool")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--mask", choices=("none", "causal"), default="causal")
    parser.add_argument("--batches", type=int_list, default=[8, 16, 32, 64])
    parser.add_argument("--backends", type=lambda s: s.split(","), default=["cuda", "cudnn"])
    parser.add_argument("--out", help="also write the rows as JSON here")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    rows = probe(args)
    print(report(args, rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"head_dim": args.head_dim, "seqlen": args.seqlen, "heads": args.heads, "mask": args.mask,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
