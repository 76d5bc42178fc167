#!/usr/bin/env python3
"""The ring-attention benchmark's report: ring.json, ring.md (tables) and
ring.png (efficiency against tokens per GPU, and time per backend), from the
rows that bench/ring.py measures, and the merge of several runs (one world
size each) into one report.

    python3 bench/ring_report.py docs/perf/ring.json            # rebuild ring.md/png from the json
    python3 bench/ring_report.py --merge w1/ring.json w2/ring.json --out-dir docs/perf

Needs only the standard library, plus matplotlib for the plot (without it the
plot is skipped with a note). bench/ring.py --merge calls the same code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prefill  # noqa: E402  (its FLOP count)

# Column order of tables and plots; backends not listed here follow, sorted.
BACKEND_ORDER = ["cuflash_ring", "torch_cp_cudnn", "torch_cp_flash"]
OURS = "cuflash_ring"
PASS_TITLES = {"fwd": "forward", "fwd_bwd": "forward + backward"}
SCALING_TITLES = {"weak": "Weak scaling (fixed tokens per GPU; global sequence = W × tokens per GPU)",
                  "strong": "Strong scaling (one fixed sequence over W GPUs)"}
# The fields that name a point; two rows with the same key are the same measurement.
KEY_FIELDS = ("scaling", "pass", "causal", "world_size", "tokens_per_gpu", "seq_len", "heads", "head_dim")


def flops(pass_name: str, seq_len: int, heads: int, head_dim: int, causal: bool, batch: int = 1) -> float:
    """Attention FLOPs of the whole sequence, prefill's rule (bench/prefill.py): 4·B·S²·H·D
    for the forward, halved when causal, ×3.5 for forward+backward (here `fwd_bwd`)."""
    return prefill.flops("fwdbwd" if pass_name == "fwd_bwd" else pass_name, batch, heads, seq_len, head_dim, causal)


def row_key(row: dict) -> tuple:
    return tuple(row.get(name) for name in KEY_FIELDS)


def sort_key(row: dict) -> tuple:
    scalings, passes = ["weak", "strong"], ["fwd", "fwd_bwd"]
    return (scalings.index(row["scaling"]) if row["scaling"] in scalings else 9, row["scaling"],
            passes.index(row["pass"]) if row["pass"] in passes else 9, row["pass"],
            not row["causal"], row["tokens_per_gpu"] if row["scaling"] == "weak" else row["seq_len"],
            row["world_size"])


def ordered_backends(rows) -> list[str]:
    present = set()
    for row in rows:
        present.update(row.get("ms", {}))
    return [b for b in BACKEND_ORDER if b in present] + sorted(present - set(BACKEND_ORDER))


def derive(row: dict) -> dict:
    """Fills the derived fields of a row from its times: TFLOP/s and tokens/s
    per GPU per backend, the efficiency (baseline / cuflash_ring) and the
    share of communication hidden, 1 - (ring - baseline) / comm_only."""
    world, seq_len, batch = row["world_size"], row["seq_len"], row.get("batch", 1)
    total = flops(row["pass"], seq_len, row["heads"], row["head_dim"], row["causal"], batch)
    row["tflops_per_gpu"], row["tokens_per_s_per_gpu"] = {}, {}
    for backend, ms in row.get("ms", {}).items():
        ok = ms is not None and ms > 0
        row["tflops_per_gpu"][backend] = round(total / world / (ms * 1e-3) / 1e12, 2) if ok else None
        row["tokens_per_s_per_gpu"][backend] = round(batch * seq_len / world / (ms * 1e-3)) if ok else None
    ring, baseline, comm = row.get("ms", {}).get(OURS), row.get("baseline_ms"), row.get("comm_only_ms")
    row["efficiency"] = round(baseline / ring, 4) if ring and baseline else None
    row["comm_hidden"] = round(1.0 - (ring - baseline) / comm, 4) if ring and baseline and comm else None
    return row


def merge_reports(reports: list[dict]) -> dict:
    """One report from several (a run per world size, say): rows of a later
    report replace those of an earlier one with the same key; meta keeps each
    run's own."""
    rows: dict[tuple, dict] = {}
    checks, runs = [], []
    for report in reports:
        meta = report.get("meta", {})
        runs += meta.get("runs", [meta])
        for row in report.get("rows", []):
            rows[row_key(row)] = row
        checks += report.get("checks", [])
    merged_meta = {"runs": runs, "world_sizes": sorted({r.get("world_size") for r in runs if r.get("world_size")})}
    for name in ("device", "date", "commit", "torch"):
        values = list(dict.fromkeys(str(r.get(name)) for r in runs if r.get(name)))
        merged_meta[name] = ", ".join(values) if values else "unknown"
    return {"meta": merged_meta, "rows": sorted(rows.values(), key=sort_key), "checks": checks}


def fmt(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def fmt_ms(value) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}" if value >= 100 else f"{value:.2f}"


def tokens_label(tokens: int) -> str:
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def mask_label(row: dict) -> str:
    return "causal" if row["causal"] else "none"


def best_peer_ratio(row: dict):
    """The fastest torch peer's time over cuflash_ring's (above 1: ours faster)."""
    ours = row.get("ms", {}).get(OURS)
    peers = [ms for backend, ms in row.get("ms", {}).items() if backend != OURS and ms]
    return min(peers) / ours if ours and peers else None


def strong_speedup(row: dict, rows: list[dict]):
    """cuflash_ring's time at W=1 over its time at this row's W, for a strong-scaling row whose
    W=1 point (same sequence, mask and pass) is among `rows`: (speedup, speedup / W)."""
    if row["scaling"] != "strong" or row["world_size"] == 1:
        return None, None
    single = next((r for r in rows if r["scaling"] == "strong" and r["world_size"] == 1 and r["pass"] == row["pass"]
                   and r["causal"] == row["causal"] and r["seq_len"] == row["seq_len"]), None)
    ours, theirs = row.get("ms", {}).get(OURS), single and single.get("ms", {}).get(OURS)
    if not ours or not theirs:
        return None, None
    speedup = theirs / ours
    return speedup, speedup / row["world_size"]


def table_header(header: list[str], text_columns: int) -> list[str]:
    """A markdown table's header lines: the first text_columns left-aligned, the rest (numbers) right."""
    return ["| " + " | ".join(header) + " |",
            "| " + " | ".join(["---"] * text_columns + ["---:"] * (len(header) - text_columns)) + " |"]


def render_markdown(report: dict, png_name: str | None = "ring.png") -> str:
    meta, rows, checks = report.get("meta", {}), report.get("rows", []), report.get("checks", [])
    runs = meta.get("runs", [meta])
    backends = ordered_backends(rows)
    first = runs[0] if runs else {}
    lines = [
        "# Ring attention: cuflash against PyTorch's context parallel",
        "",
        f"- device: {meta.get('device', 'unknown')}",
        f"- date: {meta.get('date', 'unknown')}",
        f"- commit: {meta.get('commit', 'unknown')}",
        f"- PyTorch: {meta.get('torch', 'unknown')}",
    ]
    for run in runs:
        lines.append(f"- run with W={run.get('world_size')}: {run.get('gpus', run.get('device', '?'))}; NCCL "
                     f"{run.get('nccl', '?')}; NCCL_NVLS_ENABLE={run.get('env', {}).get('NCCL_NVLS_ENABLE', 'unset')}")
    lines += [
        "",
        f"Written by `bench/ring.py` (see [bench/README.md](../../bench/README.md) and [docs/ring.md](../ring.md)); "
        f"all backends of a world size in one `torchrun`. {first.get('dtype', 'bf16')}, B={first.get('batch', 1)}, "
        f"H={first.get('heads', 16)}, D={first.get('head_dim', 128)}, random normal inputs; cuflash shards with "
        f"layout `{first.get('layout', 'zigzag')}`. Times are the maximum over ranks of each rank's median "
        "(CUDA events around each call after a warm-up, a barrier before each call). TFLOP/s per GPU = "
        "4·B·S²·H·D (halved when causal, ×3.5 for forward+backward) / W / time.",
        "",
        "- **baseline**: one GPU's own share of the work without communication — the local attention calls "
        "that the ring makes on this rank (one per block of (query chunk, key chunk) that the mask keeps, "
        "K/V already local), timed back to back, maximum over ranks. **efficiency** = baseline / cuflash_ring.",
        "- **comm only**: the ring's K/V send/recv rounds alone (W−1 rounds of K and V for the forward; "
        "the backward adds W−1 rounds of K, V and the fp32 dK/dV accumulators and one round bringing "
        "dK/dV home), no compute. **comm hidden** = 1 − (cuflash_ring − baseline) / comm only "
        "(1: all of it hidden behind compute; it can leave [0, 1] where the ring's own overhead is "
        "larger than the communication, or where the times are noise-level).",
        f"- **torch_cp_***: `torch.distributed.tensor.experimental.context_parallel` with SDPA restricted to "
        f"the cuDNN or the flash backend; {first.get('torch_cp_note', '')}".rstrip(),
        "",
    ]
    if png_name:
        lines += [f"![efficiency and time per backend]({png_name})", ""]
    lines += ["## Measured", ""]
    for scaling in dict.fromkeys(row["scaling"] for row in rows):
        for pass_name in dict.fromkeys(row["pass"] for row in rows if row["scaling"] == scaling):
            part = [row for row in rows if row["scaling"] == scaling and row["pass"] == pass_name]
            lines += [f"### {SCALING_TITLES.get(scaling, scaling)}: {PASS_TITLES.get(pass_name, pass_name)}, ms", ""]
            strong = scaling == "strong" and any(strong_speedup(r, rows)[0] for r in part)
            header = (["W", "tokens/GPU", "seq", "mask"] + backends + ["baseline", "comm only", "efficiency",
                                                                       "comm hidden", "best torch / ring"]
                      + (["speedup vs W=1", "÷ W"] if strong else []))
            lines += table_header(header, 4)
            for row in part:
                cells = [str(row["world_size"]), tokens_label(row["tokens_per_gpu"]), tokens_label(row["seq_len"]),
                         mask_label(row)]
                cells += [fmt_ms(row.get("ms", {}).get(b)) for b in backends]
                cells += [fmt_ms(row.get("baseline_ms")), fmt_ms(row.get("comm_only_ms")), fmt(row.get("efficiency")),
                          fmt(row.get("comm_hidden")), fmt(best_peer_ratio(row))]
                if strong:
                    cells += [fmt(value) for value in strong_speedup(row, rows)]
                lines.append("| " + " | ".join(cells) + " |")
            lines += ["", "TFLOP/s per GPU (tokens/s per GPU of cuflash_ring):", ""]
            header = ["W", "tokens/GPU", "seq", "mask"] + backends + [f"{OURS} tokens/s/GPU"]
            lines += table_header(header, 4)
            for row in part:
                cells = [str(row["world_size"]), tokens_label(row["tokens_per_gpu"]), tokens_label(row["seq_len"]),
                         mask_label(row)]
                cells += [fmt(row.get("tflops_per_gpu", {}).get(b), 1) for b in backends]
                tokens = row.get("tokens_per_s_per_gpu", {}).get(OURS)
                cells.append("—" if tokens is None else f"{tokens:,.0f}")
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    if checks:
        lines += ["## Correctness spot check", "",
                  "Each backend's output (and cuflash_ring's gradients) on the sharded sequence, gathered, against "
                  "single-GPU `cuflash.attention` on the whole sequence (same inputs; bf16): max absolute error "
                  "(max |reference| beside it for scale).", ""]
        lines += ["| W | seq | mask | backend | out | dq | dk | dv | max abs ref out |",
                  "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for check in checks:
            errors = check.get("max_abs_error") or {}
            if check.get("error"):
                lines.append(f"| {check.get('world_size')} | {tokens_label(check.get('seq_len', 0))} | "
                             f"{'causal' if check.get('causal') else 'none'} | {check.get('backend')} | "
                             f"failed: {check['error'][:200]} | | | | |")
                continue
            lines.append(f"| {check.get('world_size')} | {tokens_label(check.get('seq_len', 0))} | "
                         f"{'causal' if check.get('causal') else 'none'} | {check.get('backend')} | "
                         + " | ".join(fmt(errors.get(name), 5) for name in ("out", "dq", "dk", "dv"))
                         + f" | {fmt(check.get('max_abs_ref'), 3)} |")
        lines.append("")
    failures: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        for what, message in row.get("errors", {}).items():
            point = (f"W={row['world_size']} {row['scaling']} {row['pass']} {mask_label(row)} "
                     f"{tokens_label(row['tokens_per_gpu'])}/GPU")
            failures.setdefault((what, message), []).append(point)
    if failures:
        lines += ["## Failed or skipped", ""]
        for (what, message), points in failures.items():
            where = ", ".join(points) if len(points) <= 4 else f"{len(points)} points ({points[0]}, …)"
            lines.append(f"- {what}, {where}: {message}")
        lines.append("")
    return "\n".join(lines)


def write_plot(report: dict, path: str) -> bool:
    """Left: efficiency (baseline / cuflash_ring) against tokens per GPU, a line
    per (W, mask, pass) of the weak-scaling rows. Right: time per backend (and
    the baseline) of the strong-scaling rows, grouped by (W, mask, pass). False
    (and a note) without matplotlib or rows."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"ring_report: matplotlib is not installed; {path} not written", file=sys.stderr)
        return False
    rows = report.get("rows", [])
    weak = [row for row in rows if row["scaling"] == "weak"]
    strong = [row for row in rows if row["scaling"] == "strong"]
    if not weak and not strong:
        return False
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1, 1.4]})
    colors = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]
    series = sorted({(row["world_size"], row["causal"], row["pass"]) for row in weak})
    worlds = sorted({s[0] for s in series})
    tokens = sorted({row["tokens_per_gpu"] for row in weak})
    for world, causal, pass_name in series:
        points = sorted((row["tokens_per_gpu"], row["efficiency"]) for row in weak
                        if (row["world_size"], row["causal"], row["pass"]) == (world, causal, pass_name)
                        and row.get("efficiency") is not None)
        if points:
            left.plot(*zip(*points), color=colors[worlds.index(world) % len(colors)],
                      linestyle="-" if pass_name == "fwd" else "--", marker="o" if causal else "s", markersize=4,
                      label=f"W={world} {'causal' if causal else 'none'} {pass_name}")
    left.axhline(1.0, color="#888888", linewidth=0.8)
    if tokens:
        left.set_xscale("log", base=2)
        left.set_xticks(tokens)
        left.set_xticklabels([tokens_label(t) for t in tokens])
        left.minorticks_off()
    efficiencies = [row["efficiency"] for row in weak if row.get("efficiency") is not None]
    left.set_ylim(0, max([1.1] + [1.05 * e for e in efficiencies]))
    left.set_xlabel("tokens per GPU")
    left.set_ylabel("efficiency = baseline / cuflash_ring")
    left.set_title("Weak scaling: efficiency", fontsize=10)
    left.grid(True, alpha=0.3)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=7, ncol=2)

    backends = ordered_backends(strong) + ["baseline"]
    groups = sorted({(row["world_size"], row["causal"], row["pass"], row["seq_len"]) for row in strong})
    width = 0.8 / max(len(backends), 1)
    bar_colors = {"cuflash_ring": "#d62728", "torch_cp_cudnn": "#2ca02c", "torch_cp_flash": "#1f77b4",
                  "baseline": "#bbbbbb"}
    for i, backend in enumerate(backends):
        xs, ys = [], []
        for g, group in enumerate(groups):
            row = next(r for r in strong if (r["world_size"], r["causal"], r["pass"], r["seq_len"]) == group)
            value = row.get("baseline_ms") if backend == "baseline" else row.get("ms", {}).get(backend)
            if value:
                xs.append(g + (i - (len(backends) - 1) / 2) * width)
                ys.append(value)
        if xs:
            right.bar(xs, ys, width=width, label=backend, color=bar_colors.get(backend, colors[i % len(colors)]))
    right.set_xticks(range(len(groups)))
    right.set_xticklabels([f"W={w}\n{'causal' if c else 'none'}\n{p}" for w, c, p, _ in groups], fontsize=7)
    if groups:
        right.set_yscale("log")
    right.set_ylabel("ms (max over ranks of the median)")
    seqs = sorted({g[3] for g in groups})
    right.set_title("Strong scaling: " + ", ".join(tokens_label(s) for s in seqs) + " tokens, time per backend",
                    fontsize=10)
    right.grid(True, axis="y", alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=7)
    meta = report.get("meta", {})
    runs = meta.get("runs", [meta])
    fig.suptitle(f"Ring attention, {runs[0].get('dtype', 'bf16') if runs else 'bf16'} — {meta.get('device', '?')}, "
                 f"{str(meta.get('date', '?'))[:10]}, {meta.get('commit', '?')}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_report(report: dict, out_dir: str, write_json: bool = True, plot: bool = True) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if write_json:
        with open(os.path.join(out_dir, "ring.json"), "w") as f:  # a row per line: readable diffs
            rows = ",\n".join("    " + json.dumps(row, ensure_ascii=False) for row in report.get("rows", []))
            checks = ",\n".join("    " + json.dumps(c, ensure_ascii=False) for c in report.get("checks", []))
            f.write("{\n  \"meta\": " + json.dumps(report.get("meta", {}), ensure_ascii=False) + ",\n"
                    + "  \"rows\": [\n" + rows + "\n  ],\n  \"checks\": [\n" + checks + "\n  ]\n}\n")
    png = os.path.join(out_dir, "ring.png")
    plotted = write_plot(report, png) if plot else False
    with open(os.path.join(out_dir, "ring.md"), "w") as f:
        f.write(render_markdown(report, "ring.png" if plotted or os.path.exists(png) else None))


def load(path: str) -> dict:
    with open(path) as f:
        report = json.load(f)
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
        raise ValueError(f"{path}: not a ring.json (expected an object with 'meta', 'rows', 'checks')")
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild ring.md/png from ring.json, or merge several runs.")
    parser.add_argument("json", nargs="*", default=["docs/perf/ring.json"], help="default: %(default)s")
    parser.add_argument("--merge", action="store_true", help="merge the json files into one report")
    parser.add_argument("--out-dir", help="where to write (default: beside the (first) json)")
    args = parser.parse_args(argv)
    try:
        reports = [load(path) for path in args.json]
    except (OSError, ValueError) as error:
        print(f"ring_report: {error}", file=sys.stderr)
        return 1
    out_dir = args.out_dir or os.path.dirname(os.path.abspath(args.json[0]))
    if args.merge or len(reports) > 1:
        write_report(merge_reports(reports), out_dir)
    else:
        write_report(reports[0], out_dir, write_json=False)
    print(f"ring_report: wrote {out_dir}/ring.{{json,md,png}}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
