#!/usr/bin/env python3
"""The decode benchmark's report: merging per-backend results into one row per
point, and writing decode.json and decode.md (GB/s of K and V read per backend,
the fraction of the copy bandwidth, the ratio to the best peer, and issue 5's
acceptance checks).

bench/decode.py measures and then calls write_report(); run this file alone to
rebuild the markdown from an existing json without measuring:

    python3 bench/decode_report.py docs/perf/decode.json

Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterable

BACKENDS = ["cuflash_cuda", "cuflash_cudnn", "torch_flash", "torch_cudnn"]
SUBJECT = "cuflash_cuda"
PEERS = ["cuflash_cudnn", "torch_flash", "torch_cudnn"]
TORCH = ("torch_flash", "torch_cudnn")
# Issue 5's bars, at kv_len >= ACCEPT_KV on the paged caches.
ACCEPT_KV = 4096
ACCEPT_COPY_FRACTION = 0.90
ACCEPT_PEER_RATIO = 1.0
ACCEPT_LATENCY_SLACK = 1.10  # batch 1, kv 4k: within 10% of the best peer's time
POINT_FIELDS = ("batch", "kv_len", "heads_q", "heads_kv", "head_dim", "page_size")


def point_key(row: dict) -> tuple:
    return tuple(int(row[k]) for k in POINT_FIELDS)


def merge_rows(results: Iterable[dict], meta: dict) -> list[dict]:
    """One row per (batch, kv_len, heads_q, heads_kv, head_dim, page_size).

    cuflash results carry their own page size (0: contiguous); the torch
    peers run on the contiguous cache only, and their numbers are entered in
    every row of the same shape whatever its page size (the rows say so).
    """
    results = list(results)
    torch_by_shape: dict[tuple, dict] = {}
    for r in results:
        if r["backend"] in TORCH:
            torch_by_shape.setdefault(point_key(r)[:5], {})[r["backend"]] = r
    rows: dict[tuple, dict] = {}

    def row_for(key: tuple) -> dict:
        if key not in rows:
            rows[key] = dict(zip(POINT_FIELDS, key), dtype=meta.get("dtype", "bf16"),
                             device=meta.get("device", "unknown"), copy_gbps=meta.get("copy_gbps"),
                             gbps={}, median_us={}, errors={}, notes={})
        return rows[key]

    def enter(row: dict, r: dict) -> None:
        backend = r["backend"]
        gbps = r.get("gbps")
        row["gbps"][backend] = None if gbps is None else round(float(gbps), 1)
        ms = r.get("median_ms")
        row["median_us"][backend] = None if ms is None or r.get("error") else round(float(ms) * 1e3, 2)
        if r.get("error"):
            row["errors"][backend] = ("skipped: " if r.get("skipped") and not str(r["error"]).startswith("skipped")
                                      else "") + str(r["error"])
        if r.get("note"):
            row["notes"][backend] = r["note"]

    for r in results:
        if r["backend"] not in TORCH:
            enter(row_for(point_key(r)), r)
    for row in rows.values():
        for r in torch_by_shape.get(point_key(row)[:5], {}).values():
            enter(row, r)
    # Torch shapes no cuflash row has (cuflash not run): a contiguous row of their own.
    for shape, peers in torch_by_shape.items():
        if not any(point_key(row)[:5] == shape for row in rows.values()):
            for r in peers.values():
                enter(row_for(shape + (0,)), r)

    for row in rows.values():
        derive(row)
    return [rows[k] for k in sorted(rows, key=lambda k: (k[2], k[3], k[4], k[5], k[0], k[1]))]


def derive(row: dict) -> None:
    """The ratios the issue tracks: of the copy bandwidth, and to the best peer."""
    subject = row["gbps"].get(SUBJECT)
    copy = row.get("copy_gbps")
    row["copy_fraction"] = round(subject / copy, 3) if subject and copy else None
    peers = {p: row["gbps"][p] for p in PEERS if row["gbps"].get(p)}
    best = max(peers, key=peers.get) if peers else None
    row["best_peer"] = best
    row["vs_best_peer"] = round(subject / peers[best], 3) if subject and best else None


def acceptance(rows: list[dict]) -> dict:
    """Issue 5's bars over the paged rows: at kv_len >= 4k, >= 90% of copy
    bandwidth and >= 1.0x the best peer at every point; batch 1, kv 4k, the
    latency within 10% of the best peer's."""
    paged = [r for r in rows if r["page_size"] > 0 and r["kv_len"] >= ACCEPT_KV]
    measured = [r for r in paged if r["gbps"].get(SUBJECT)]
    copy_misses = [r for r in measured if (r["copy_fraction"] or 0) < ACCEPT_COPY_FRACTION]
    peer_misses = [r for r in measured if r["vs_best_peer"] is not None and r["vs_best_peer"] < ACCEPT_PEER_RATIO]
    unmeasured = [r for r in paged if not r["gbps"].get(SUBJECT)]
    latency = []
    for r in rows:
        if r["page_size"] == 0 or r["batch"] != 1 or r["kv_len"] != ACCEPT_KV:
            continue
        ours = r["median_us"].get(SUBJECT)
        peer_times = {p: r["median_us"][p] for p in PEERS if r["median_us"].get(p)}
        best = min(peer_times, key=peer_times.get) if peer_times else None
        latency.append(dict(heads=f"{r['heads_q']}/{r['heads_kv']}", page_size=r["page_size"], ours_us=ours,
                            best_peer=best, peer_us=peer_times.get(best),
                            ok=bool(ours and best and ours <= ACCEPT_LATENCY_SLACK * peer_times[best])))
    return dict(points=len(paged), measured=len(measured), unmeasured=unmeasured, copy_misses=copy_misses,
                peer_misses=peer_misses, latency=latency)


def fmt(value, digits=0, suffix="") -> str:
    return "—" if value is None else f"{value:.{digits}f}{suffix}"


def point_label(r: dict) -> str:
    return f"{r['heads_q']}/{r['heads_kv']} page {r['page_size']} B={r['batch']} kv={r['kv_len']}"


def markdown(rows: list[dict], meta: dict) -> str:
    out = []
    add = out.append
    add("# Decode: GB/s of K and V read")
    add("")
    add(f"{meta.get('device', 'unknown GPU')}, {meta.get('dtype', 'bf16')}, head_dim "
        f"{rows[0]['head_dim'] if rows else '?'}, one query per sequence, no append; commit "
        f"{meta.get('commit', 'unknown')}, {meta.get('date', '')}, PyTorch {meta.get('torch', '?')}. "
        "Generated by `bench/decode.py` (rebuild with `python3 bench/decode_report.py decode.json`).")
    add("")
    add(f"**Copy bandwidth: {fmt(meta.get('copy_gbps'))} GB/s** (a {meta.get('copy_bytes', 0) / (1 << 30):g} GiB "
        "device-to-device copy: bytes read + bytes written per second, same run).")
    add("")
    add("GB/s = 2·B·kv_len·Hk·D·2 bytes of K and V / median time (CUDA events, L2 overwritten before each call), "
        "for every backend alike. `cuflash_*` run on the row's cache (page 0: contiguous; paged: shuffled block "
        "tables); `torch_*` (SDPA) always on the contiguous cache of the same shape. `% copy` is cuflash_cuda's "
        "GB/s over the copy bandwidth; `vs best` its GB/s over the best of the other three.")
    add("")
    acc = acceptance(rows)
    add("## Issue 5's bars (paged caches, kv_len ≥ 4k)")
    add("")
    add(f"- Points: {acc['points']}, measured for cuflash_cuda: {acc['measured']}"
        + (f" (not measured: {', '.join(point_label(r) for r in acc['unmeasured'][:8])}"
           f"{' …' if len(acc['unmeasured']) > 8 else ''})" if acc["unmeasured"] else "") + ".")
    add(f"- ≥ {ACCEPT_COPY_FRACTION:.0%} of copy bandwidth: {acc['measured'] - len(acc['copy_misses'])} of "
        f"{acc['measured']}" + ("" if not acc["copy_misses"] else "; below: " + ", ".join(
            f"{point_label(r)} ({fmt(100 * r['copy_fraction'], 0, '%')})" for r in acc["copy_misses"][:12])
            + (" …" if len(acc["copy_misses"]) > 12 else "")) + ".")
    add(f"- ≥ {ACCEPT_PEER_RATIO:.1f}× the best peer: {acc['measured'] - len(acc['peer_misses'])} of "
        f"{acc['measured']}" + ("" if not acc["peer_misses"] else "; below: " + ", ".join(
            f"{point_label(r)} ({fmt(r['vs_best_peer'], 2, '×')} {r['best_peer']})" for r in acc["peer_misses"][:12])
            + (" …" if len(acc["peer_misses"]) > 12 else "")) + ".")
    add("- Batch 1, kv_len 4k, latency within 10% of the best peer:")
    add("")
    add("| Hq/Hk | page | cuflash_cuda µs | best peer | its µs | within 10% |")
    add("| --- | ---: | ---: | --- | ---: | --- |")
    for item in acc["latency"]:
        add(f"| {item['heads']} | {item['page_size']} | {fmt(item['ours_us'], 1)} | {item['best_peer'] or '—'} | "
            f"{fmt(item['peer_us'], 1)} | {'yes' if item['ok'] else 'no'} |")
    add("")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["heads_q"], r["heads_kv"], r["page_size"]), []).append(r)
    for (hq, hk, page), group in groups.items():
        add(f"## Hq/Hk = {hq}/{hk}, " + ("contiguous cache" if page == 0 else f"page {page}"))
        add("")
        add("| batch | kv_len | " + " | ".join(f"{b} GB/s" for b in BACKENDS) + " | % copy | vs best | cuda µs |")
        add("| ---: | ---: | " + " | ".join("---:" for _ in BACKENDS) + " | ---: | ---: | ---: |")
        for r in group:
            cells = []
            for b in BACKENDS:
                value = r["gbps"].get(b)
                error = r["errors"].get(b, "")
                cells.append(fmt(value) + ("*" if r["notes"].get(b) else "") if value is not None else
                             ("skip" if error.startswith("skipped") else ("fail" if error else "—")))
            add(f"| {r['batch']} | {r['kv_len']} | " + " | ".join(cells) + f" | "
                f"{fmt(None if r['copy_fraction'] is None else 100 * r['copy_fraction'], 0, '%')} | "
                f"{fmt(r['vs_best_peer'], 2, '×')} | {fmt(r['median_us'].get(SUBJECT), 1)} |")
        add("")
    notes = [(r, b, n) for r in rows for b, n in r["notes"].items()]
    failures = [(r, b, e) for r in rows for b, e in r["errors"].items() if not e.startswith("skipped")]
    skips = [(r, b) for r in rows for b, e in r["errors"].items() if e.startswith("skipped")]
    if notes:
        add("## Notes (`*`)")
        add("")
        seen = set()
        for r, b, n in notes:
            if (b, n) not in seen:
                seen.add((b, n))
                add(f"- {b}, e.g. {point_label(r)}: {n}")
        add("")
    if failures:
        add("## Failures")
        add("")
        for r, b, e in failures:
            add(f"- {point_label(r)}, {b}: {e}")
        add("")
    if skips:
        add("## Skipped (tensors larger than free GPU memory)")
        add("")
        add(", ".join(f"{point_label(r)} {b}" for r, b in skips))
        add("")
    return "\n".join(out)


def write_report(rows: list[dict], meta: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "decode.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
        f.write("\n")
    with open(os.path.join(out_dir, "decode.md"), "w") as f:
        f.write(markdown(rows, meta) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild decode.md from decode.json.")
    parser.add_argument("json_path")
    parser.add_argument("--out-dir", default=None, help="default: the json's folder")
    args = parser.parse_args(argv)
    with open(args.json_path) as f:
        data = json.load(f)
    rows = data["rows"]
    for row in rows:
        derive(row)
    write_report(rows, data["meta"], args.out_dir or os.path.dirname(os.path.abspath(args.json_path)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
