#!/usr/bin/env python3
"""The plot of bench/linear_vs_softmax.py: time against sequence length, log-log,
one panel per (series, pass) and one per decode batch, one line per kernel.

Reads the benchmark's json alone, so that the plot can be drawn on any machine
with matplotlib after the GPU run (the GPU machine may not have it):

    python3 bench/plot_linear.py path/to/linear_vs_softmax.json out.png

panels() needs only the standard library; draw() imports matplotlib.
"""

from __future__ import annotations

import json
import sys

# Line order and legend names; the same names as the benchmark's tables.
KERNEL_LABELS = {
    "cuflash_linear": "cuflash linear",
    "fla_linear": "fla linear (chunk)",
    "cuflash_softmax": "cuflash softmax (cuda)",
    "cudnn_softmax": "cuDNN softmax (SDPA)",
    "flash_softmax": "flash softmax (SDPA)",
}
PASS_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}
SERIES_TITLES = {"tokens16k": "16k tokens per batch", "b1": "B = 1"}


def panels(rows: list[dict]) -> list[tuple[str, str, dict[str, list[tuple[int, float]]]]]:
    """[(title, x label, {kernel: [(length, ms), ...]})] in the order the rows
    first name them; points without a time (skipped, failed) are left out, so a
    line simply stops where its kernel could not run."""
    grouped: dict[tuple, dict[str, list[tuple[int, float]]]] = {}
    titles: dict[tuple, tuple[str, str]] = {}
    for row in rows:
        if row["series"] == "decode":
            key = ("decode", row["batch"])
            titles[key] = (f"decode step, B = {row['batch']}", "context (tokens)")
        else:
            key = (row["series"], row["pass"])
            titles[key] = (f"{PASS_TITLES.get(row['pass'], row['pass'])}, "
                           f"{SERIES_TITLES.get(row['series'], row['series'])}", "sequence length")
        lines = grouped.setdefault(key, {})
        for kernel, ms in row["median_ms"].items():
            if ms is not None:
                lines.setdefault(kernel, []).append((row["seqlen"], ms))
    ordered = []
    for key, lines in grouped.items():
        kernels = [k for k in KERNEL_LABELS if k in lines] + sorted(k for k in lines if k not in KERNEL_LABELS)
        ordered.append((*titles[key], {k: sorted(lines[k]) for k in kernels}))
    return ordered


def draw(doc: dict, path: str) -> None:
    """Writes the png; raises ImportError without matplotlib."""
    import matplotlib
    matplotlib.use("Agg")  # no display on the machines this runs on
    import matplotlib.pyplot as plt

    groups = panels(doc["rows"])
    if not groups:
        raise ValueError("no rows to plot")
    columns = 2
    rows_of_panels = (len(groups) + columns - 1) // columns
    figure, axes = plt.subplots(rows_of_panels, columns, figsize=(6.5 * columns, 4.2 * rows_of_panels),
                                squeeze=False)
    for axis, (title, xlabel, lines) in zip(axes.flat, groups):
        for kernel, points in lines.items():
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                      label=KERNEL_LABELS.get(kernel, kernel))
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_title(title, fontsize=10)
        axis.set_xlabel(xlabel)
        axis.set_ylabel("median ms per call")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(groups):]:
        axis.set_visible(False)
    header = doc["header"]
    figure.suptitle(f"Linear vs softmax attention: {header.get('device', '?')}, commit {header.get('commit', '?')}, "
                    f"H={header.get('heads', '?')}, D={header.get('head_dim', '?')}, {header.get('dtype', 'bf16')}",
                    fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        doc = json.load(f)
    try:
        draw(doc, argv[1])
    except ImportError as exc:
        print(f"plot_linear: matplotlib is needed for the plot ({exc})", file=sys.stderr)
        return 1
    print(f"plot_linear: wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
