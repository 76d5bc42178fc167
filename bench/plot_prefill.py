#!/usr/bin/env python3
"""The prefill benchmark's report: merging per-backend results into rows, and
writing prefill.json, prefill.md (tables with ratios) and prefill.png
(TFLOP/s against seqlen per backend).

bench/prefill.py measures and then calls write_report(); run this file alone to
rebuild the markdown and the plot from an existing json without measuring:

    python3 bench/plot_prefill.py docs/perf/prefill.json

Needs only the standard library, plus matplotlib for the plot (without it the
plot is skipped with a note).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Iterable

# Column order of tables and plots; backends not listed here follow, sorted.
BACKEND_ORDER = ["cuflash_cuda", "cuflash_cuda_det", "cuflash_cudnn", "torch_flash", "torch_cudnn", "torch_efficient",
                 "fa4"]
# Each cuflash backend's ratio is taken against these peers, where present
# (fa4: FlashAttention-4, when the run had it).
RATIO_PEERS = ["torch_flash", "torch_cudnn", "fa4"]
# The ratios that the issues track, and whose shortfalls the report lists.
PRIMARY = ("cuflash_cuda", "torch_flash")
# The deterministic backward against the default one (issue 20: >= 0.85).
DETERMINISM = ("cuflash_cuda_det", "cuflash_cuda")
TARGETS = [(PRIMARY, 1.0), (("cuflash_cudnn", "torch_cudnn"), 0.97), (DETERMINISM, 0.85)]
PASS_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward"}


def point_key(row: dict) -> tuple:
    return (row["pass"], int(row["head_dim"]), bool(row["causal"]), int(row["seqlen"]), row.get("sweep", "prefill"))


def sort_key(key: tuple) -> tuple:
    passes = ["fwd", "fwdbwd"]
    return (key[4] != "prefill", key[4], passes.index(key[0]) if key[0] in passes else len(passes), key[0]) + key[1:4]


def is_small(row: dict) -> bool:
    """A row of the small shapes (B=1, H=16), where the per-call time is mostly overhead."""
    return row.get("sweep", "prefill") == "small"


def merge_rows(results: Iterable[dict], meta: dict) -> list[dict]:
    """One row per (pass, head_dim, causal, seqlen) from per-backend results.

    Each result is a dict with pass, head_dim, causal, seqlen, batch, heads,
    backend (the report's name, e.g. "cuflash_cuda"), and tflops, median_ms
    and error (tflops None when error is set). meta gives dtype, device,
    date, commit, torch, layout; every row carries them so that the json
    alone is enough to rebuild the report.
    """
    rows: dict[tuple, dict] = {}
    for result in results:
        key = point_key(result)
        row = rows.get(key)
        if row is None:
            row = {
                "pass": key[0], "head_dim": key[1], "causal": key[2], "seqlen": key[3],
                "batch": int(result["batch"]), "heads": int(result["heads"]),
                "dtype": meta.get("dtype", "bf16"), "device": meta.get("device", "unknown"),
                "tflops": {}, "median_ms": {},
            }
            if key[4] != "prefill":
                row["sweep"] = key[4]
            rows[key] = row
        elif (row["batch"], row["heads"]) != (int(result["batch"]), int(result["heads"])):
            raise ValueError(f"point {key}: backends disagree on batch/heads: "
                             f"{row['batch']}x{row['heads']} vs {result['batch']}x{result['heads']}")
        backend = result["backend"]
        tflops = result.get("tflops")
        row["tflops"][backend] = None if tflops is None else round(float(tflops), 2)
        ms = result.get("median_ms")
        row["median_ms"][backend] = None if ms is None else round(float(ms), 5)
        # Host-side costs: the first call (graph builds) and the launch of one call.
        for name, digits in (("first_call_ms", 3), ("host_us", 2)):
            if result.get(name) is not None:
                row.setdefault(name, {})[backend] = round(float(result[name]), digits)
        if result.get("error"):
            row.setdefault("errors", {})[backend] = str(result["error"])
    merged = [rows[key] for key in sorted(rows, key=sort_key)]
    extra = {name: meta[name] for name in ("date", "commit", "torch", "layout") if name in meta}
    for row in merged:
        row.update(extra)
        row["tflops"] = {b: row["tflops"][b] for b in ordered_backends([row])}
        row["median_ms"] = {b: row["median_ms"][b] for b in ordered_backends([row])}
        for name in ("first_call_ms", "host_us"):
            if name in row:
                row[name] = {b: row[name][b] for b in ordered_backends([row]) if b in row[name]}
    return merged


def ordered_backends(rows: Iterable[dict]) -> list[str]:
    present = set()
    for row in rows:
        present.update(row["tflops"])
    return [b for b in BACKEND_ORDER if b in present] + sorted(present - set(BACKEND_ORDER))


def ratio(row: dict, numerator: str, denominator: str):
    a, b = row["tflops"].get(numerator), row["tflops"].get(denominator)
    if a is None or b is None or b <= 0:
        return None
    return a / b


def ratio_columns(backends: list[str]) -> list[tuple[str, str]]:
    peers = [(c, p) for c in backends if c.startswith("cuflash_") for p in RATIO_PEERS if p in backends]
    return peers + ([DETERMINISM] if all(b in backends for b in DETERMINISM) else [])


def seqlen_label(seqlen: int) -> str:
    return f"{seqlen // 1024}k" if seqlen >= 1024 and seqlen % 1024 == 0 else str(seqlen)


def geomean(values: list[float]):
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(value, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def first_meta(rows: list[dict], name: str, default: str = "unknown") -> str:
    for row in rows:
        if row.get(name):
            return str(row[name])
    return default


def render_markdown(rows: list[dict], png_name: str | None = "prefill.png") -> str:
    all_rows = rows
    small = [row for row in rows if is_small(row)]
    rows = [row for row in rows if not is_small(row)]
    backends = ordered_backends(rows)
    ratios = ratio_columns(backends)
    device, date, commit = first_meta(rows, "device"), first_meta(rows, "date"), first_meta(rows, "commit")
    dtype, layout, torch = first_meta(rows, "dtype", "bf16"), first_meta(rows, "layout", "bshd"), first_meta(rows, "torch")
    lines = [
        "# Prefill: cuflash against PyTorch SDPA",
        "",
        f"- device: {device}",
        f"- date: {date}",
        f"- commit: {commit}",
        f"- PyTorch: {torch}",
        "",
        "Written by `bench/prefill.py` (see [bench/README.md](../../bench/README.md)); all backends in one run. "
        f"FlashAttention papers' shapes: 16k tokens per batch (B = 16384/S), hidden 2048 (D=64: 32 heads, "
        f"D=128: 16 heads, D=256: 8 heads), {dtype}, random normal inputs in [B, S, H, D] memory "
        + ("(PyTorch gets the same memory as a [B, H, S, D] view)" if layout == "bshd"
           else "(PyTorch gets contiguous [B, H, S, D] tensors)")
        + ". TFLOP/s = 4·B·H·S²·D (halved when causal, ×3.5 for forward+backward) / median time; "
        "each call timed alone with CUDA events after a warm-up, the L2 cache overwritten before each call.",
        "",
    ]
    if png_name:
        lines += [f"![TFLOP/s against sequence length]({png_name})", ""]
    for pass_name in dict.fromkeys(row["pass"] for row in rows):
        pass_rows = [row for row in rows if row["pass"] == pass_name]
        lines += [f"## {PASS_TITLES.get(pass_name, pass_name)} (`{pass_name}`), TFLOP/s", ""]
        header = ["D", "mask", "seqlen", "B×H"] + backends + [f"{c} / {p}" for c, p in ratios]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("| " + " | ".join(["---"] * 3 + ["---"] + ["---:"] * (len(backends) + len(ratios))) + " |")
        for row in pass_rows:
            cells = [str(row["head_dim"]), "causal" if row["causal"] else "none", seqlen_label(row["seqlen"]),
                     f"{row['batch']}×{row['heads']}"]
            cells += [fmt(row["tflops"].get(b)) for b in backends]
            cells += [fmt(ratio(row, c, p), 2) for c, p in ratios]
            lines.append("| " + " | ".join(cells) + " |")
        summary = []
        for c, p in ratios:
            mean = geomean([ratio(row, c, p) for row in pass_rows])
            if mean is not None:
                summary.append(f"{c} / {p} {mean:.2f}")
        if summary:
            lines += ["", "Geometric mean of the ratios: " + "; ".join(summary) + "."]
        lines.append("")

    for (numerator, denominator), threshold in TARGETS:
        if numerator not in backends or denominator not in backends:
            continue
        slower = [row for row in rows if (r := ratio(row, numerator, denominator)) is not None and r < threshold]
        missing = [row for row in rows if ratio(row, numerator, denominator) is None]
        lines += [f"## Points where {numerator} / {denominator} < {threshold}", ""]
        if slower:
            for row in slower:
                lines.append(f"- {row['pass']} D={row['head_dim']} {'causal' if row['causal'] else 'none'} "
                             f"S={seqlen_label(row['seqlen'])}: {ratio(row, numerator, denominator):.2f} "
                             f"({fmt(row['tflops'][numerator])} vs {fmt(row['tflops'][denominator])} TFLOP/s)")
        else:
            lines.append("None" + (" among the points both measured." if missing else "."))
        if missing:
            lines.append(f"- no ratio (a backend has no time) at {len(missing)} of {len(rows)} points")
        lines.append("")

    if small:
        lines += render_small(small)

    failures: dict[tuple[str, str], list[str]] = {}
    for row in all_rows:
        for backend, message in row.get("errors", {}).items():
            point = (f"{row['pass']} D={row['head_dim']} {'causal' if row['causal'] else 'none'} "
                     f"S={seqlen_label(row['seqlen'])}" + (f" B={row['batch']} H={row['heads']}" if is_small(row) else ""))
            failures.setdefault((backend, message), []).append(point)
    if failures:
        lines += ["## Failed points", ""]
        for (backend, message), points in failures.items():
            where = ", ".join(points) if len(points) <= 4 else f"{len(points)} points ({points[0]}, …)"
            lines.append(f"- {backend}, {where}: {message}")
        lines.append("")
    return "\n".join(lines)


def render_small(rows: list[dict]) -> list[str]:
    """The small shapes: time per call (µs) per backend, speed ratios, and the host-side costs."""
    backends = ordered_backends(rows)
    ratios = ratio_columns(backends)
    batch, heads = rows[0]["batch"], rows[0]["heads"]
    lines = [f"## Small problems (B={batch}, H={heads}): time per call, µs", "",
             "GPU time per call (CUDA events, median) where the call is mostly overhead; a ratio is the peer's "
             "time over cuflash's (above 1: cuflash faster).", ""]
    header = ["pass", "D", "mask", "seqlen"] + backends + [f"{c} / {p}" for c, p in ratios]
    lines += ["| " + " | ".join(header) + " |", "| " + " | ".join(["---"] * 4 + ["---:"] * (len(header) - 4)) + " |"]
    for row in rows:
        us = {b: None if row["median_ms"].get(b) is None else row["median_ms"][b] * 1e3 for b in backends}
        cells = [row["pass"], str(row["head_dim"]), "causal" if row["causal"] else "none", str(row["seqlen"])]
        cells += [fmt(us[b]) for b in backends]
        cells += [fmt(us[p] / us[c] if us[c] and us[p] else None, 2) for c, p in ratios]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Host side: median time to launch one call (µs) / wall time of the first call of the shape (ms; "
              "cuflash_cudnn builds its cuDNN graphs then, PyTorch its own).", ""]
    lines += ["| " + " | ".join(["pass", "D", "mask", "seqlen"] + backends) + " |",
              "| " + " | ".join(["---"] * 4 + ["---:"] * len(backends)) + " |"]
    for row in rows:
        cells = [row["pass"], str(row["head_dim"]), "causal" if row["causal"] else "none", str(row["seqlen"])]
        for b in backends:
            host, first = row.get("host_us", {}).get(b), row.get("first_call_ms", {}).get(b)
            cells.append("—" if host is None and first is None else f"{fmt(host)} / {fmt(first)}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def write_plot(rows: list[dict], path: str) -> bool:
    """TFLOP/s against seqlen, one line per backend; a subplot per pass (rows)
    and (head_dim, mask) (columns). False (and a note) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"plot_prefill: matplotlib is not installed; {path} not written", file=sys.stderr)
        return False
    rows = [row for row in rows if not is_small(row)]
    if not rows:
        return False
    backends = ordered_backends(rows)
    passes = list(dict.fromkeys(row["pass"] for row in rows))
    panels = sorted({(row["head_dim"], row["causal"]) for row in rows})
    fig, axes = plt.subplots(len(passes), len(panels), figsize=(3.6 * len(panels), 3.0 * len(passes) + 0.9),
                             squeeze=False, sharex=True)
    styles = {
        "cuflash_cuda": dict(color="#d62728", marker="o", linewidth=2.2),
        "cuflash_cudnn": dict(color="#9467bd", marker="D", linewidth=2.2),
        "torch_flash": dict(color="#1f77b4", marker="s", linestyle="--"),
        "torch_cudnn": dict(color="#2ca02c", marker="^", linestyle="--"),
        "torch_efficient": dict(color="#7f7f7f", marker="v", linestyle=":"),
        "fa4": dict(color="#ff7f0e", marker="P", linestyle="--"),
    }
    seqlens = sorted({row["seqlen"] for row in rows})
    for i, pass_name in enumerate(passes):
        for j, (head_dim, causal) in enumerate(panels):
            ax = axes[i][j]
            panel_rows = sorted((row for row in rows if row["pass"] == pass_name and row["head_dim"] == head_dim
                                 and row["causal"] == causal), key=lambda row: row["seqlen"])
            for backend in backends:
                points = [(row["seqlen"], row["tflops"].get(backend)) for row in panel_rows]
                points = [(x, y) for x, y in points if y is not None]
                if points:
                    ax.plot(*zip(*points), label=backend, markersize=4, **styles.get(backend, {}))
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens)
            ax.set_xticklabels([seqlen_label(s) for s in seqlens])
            ax.minorticks_off()
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"{pass_name}, D={head_dim}, {'causal' if causal else 'no mask'}", fontsize=10)
            if j == 0:
                ax.set_ylabel("TFLOP/s")
            if i == len(passes) - 1:
                ax.set_xlabel("sequence length")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes.flat:  # a backend missing from the first panel still gets a legend entry
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), frameon=False, fontsize=9,
               bbox_to_anchor=(0.5, 1.0))
    fig.suptitle(f"Prefill attention, {first_meta(rows, 'dtype', 'bf16')}, 16k tokens, hidden 2048 — "
                 f"{first_meta(rows, 'device')}, {first_meta(rows, 'date')[:10]}, {first_meta(rows, 'commit')}",
                 fontsize=10, y=0.955)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(rows: list[dict], out_dir: str, write_json: bool = True) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if write_json:
        with open(os.path.join(out_dir, "prefill.json"), "w") as f:  # a row per line: readable diffs
            f.write("[\n" + ",\n".join(json.dumps(row, ensure_ascii=False) for row in rows) + "\n]\n")
    png = os.path.join(out_dir, "prefill.png")
    plotted = write_plot(rows, png)
    text = render_markdown(rows, "prefill.png" if plotted or os.path.exists(png) else None)
    # The causes found for the shortfalls (profiles, SASS) are written by hand
    # in prefill-reasons.md beside the report and carried into it verbatim.
    reasons = os.path.join(out_dir, "prefill-reasons.md")
    if os.path.exists(reasons):
        with open(reasons) as f:
            text += "\n" + f.read()
    with open(os.path.join(out_dir, "prefill.md"), "w") as f:
        f.write(text)
    print(f"plot_prefill: wrote {out_dir}/prefill.{{{'json,' if write_json else ''}md{',png' if plotted else ''}}}",
          file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description="Rebuild prefill.md and prefill.png from prefill.json.")
    parser.add_argument("json", nargs="?", default="docs/perf/prefill.json", help="default: %(default)s")
    parser.add_argument("--out-dir", help="where to write prefill.md/png (default: beside the json)")
    args = parser.parse_args()
    with open(args.json) as f:
        rows = json.load(f)
    if not isinstance(rows, list) or not rows:
        print(f"plot_prefill: {args.json}: expected a non-empty list of rows", file=sys.stderr)
        return 1
    write_report(rows, args.out_dir or os.path.dirname(os.path.abspath(args.json)), write_json=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
