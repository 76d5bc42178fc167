#!/usr/bin/env python3
"""A/B of builds of the `cuflash` command on the same prefill points, in one
run on one GPU, with PyTorch SDPA's cuDNN beside them: a base and one or
more changes.

    python3 bench/ab.py --base BASE/bin/cuflash --change NEW/bin/cuflash [--change NEW2/bin/cuflash ...] \\
        [--rounds 2] [--head-dims 64,128,256] [--seqlens 512,2048,16384] [--masks none,causal] \\
        [--passes fwd] [--deterministic] [--backends torch_cudnn] [--label-base main] [--label-change change ...]
        [--sweep small] [--out-dir DIR]

Each round runs `cuflash bench --json` once with each build in turn (the
base, then the changes, each its own process, timed as bench/prefill.py
times them); the PyTorch peers run after, in this process. The first change
is `change` in the json and the table, the next ones `change2`, `change3`...
A point's figure for a build is the median of its rounds' medians, and its
spread (the largest over the smallest round) says how far the machine moved
the same binary between rounds: a change/base ratio inside that spread is
noise. Writes ab.json and ab.md into --out-dir (see bench/README.md).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import add_timing_arguments, int_list, name_list, run_json_lines, timing_flags  # noqa: E402
import prefill  # noqa: E402


def log(message: str) -> None:
    print(f"ab: {message}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the baseline's cuflash command")
    parser.add_argument("--change", required=True, action="append",
                        help="a change's cuflash command (repeat for more changes)")
    parser.add_argument("--label-base", default="base")
    parser.add_argument("--label-change", action="append", default=[],
                        help="a change's label, in the order of --change (default: its name)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs of each build")
    parser.add_argument("--passes", type=name_list(prefill.PASSES), default=["fwd"])
    parser.add_argument("--head-dims", type=int_list, default=prefill.HEAD_DIMS)
    parser.add_argument("--masks", type=name_list(prefill.MASKS), default=prefill.MASKS)
    parser.add_argument("--seqlens", type=int_list, default=[512, 2048, 16384])
    parser.add_argument("--sweep", choices=["prefill", "small"], default="prefill",
                        help="the prefill sweep's shapes, or the small ones (B=1, H=16, D = 64 / 128: "
                             "--seqlens are then their lengths)")
    parser.add_argument("--batch", dest="small_batch", type=int, default=None,
                        help="--sweep small: the batch instead of B=1 (grids of a few waves)")
    parser.add_argument("--heads", dest="small_heads", type=int, default=None,
                        help="--sweep small: the heads instead of H=16")
    parser.add_argument("--backends", type=name_list(list(prefill.TORCH_BACKENDS)), default=["torch_cudnn"],
                        help="PyTorch peers timed on the same points")
    parser.add_argument("--no-peers", action="store_true", help="no PyTorch peers")
    parser.add_argument("--deterministic", action="store_true",
                        help="the builds' backward in deterministic mode (forward+backward points only; the peers "
                             "run as usual)")
    parser.add_argument("--dtype", choices=["bf16"], default="bf16")
    parser.add_argument("--torch-layout", choices=["bshd", "bhsd"], default="bshd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", default=os.environ.get("OUT", "."))
    add_timing_arguments(parser, rep_ms=150.0)
    args = parser.parse_args(argv)
    if args.no_peers:
        args.backends = []
    # (prefill.points reads the small shapes' lengths from small_seqlens.)
    args.small_seqlens = args.seqlens
    if args.deterministic and args.passes != ["fwdbwd"]:
        parser.error("--deterministic: times the backward, so --passes fwdbwd only")
    if (args.small_batch or args.small_heads) and args.sweep != "small":
        parser.error("--batch / --heads: the small sweep's shape, so --sweep small only")
    if len(args.label_change) > len(args.change):
        parser.error("--label-change: more labels than --change builds")
    return args


def change_names(count: int) -> list[str]:
    """The changes' names in the json and the table: change, change2, ..."""
    return ["change"] + [f"change{i}" for i in range(2, count + 1)]


def key(row: dict) -> tuple:
    return (row["pass"], row["head_dim"], bool(row["causal"]), row["seqlen"])


def run_build(args, command: str) -> dict:
    """One `cuflash bench` run of a build: point -> TFLOP/s (None: failed)."""
    if args.sweep == "small":
        batch, heads = prefill.small_shape(args)
        shape = ["--batch", str(batch), "--heads", str(heads)]
    else:
        shape = ["--sweep", "prefill"]
    flags = ["bench", *shape, "--json", "--backend", "cuda", "--pass", ",".join(args.passes),
             "--head-dim", ",".join(map(str, prefill.head_dims(args, args.sweep))), "--mask", ",".join(args.masks),
             "--seqlen", ",".join(map(str, args.seqlens)), "--seed", str(args.seed), *timing_flags(args)]
    if args.deterministic:
        flags.append("--deterministic")
    rows = {}

    def add(row: dict) -> None:
        rows[key(row)] = row.get("tflops") if not row.get("error") else None

    run_json_lines([command, *flags], log, add)
    return rows


def spread(values: list[float]) -> float | None:
    return max(values) / min(values) if values and min(values) > 0 else None


def fmt(x, digits=1):
    return "—" if x is None else f"{x:.{digits}f}"


def gpu_name():
    """The GPU's name without torch (the --no-peers runs), from nvidia-smi; None where it cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    name = out.stdout.strip().splitlines()
    return name[0] if out.returncode == 0 and name else None


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    changes = change_names(len(args.change))
    builds = {"base": args.base, **dict(zip(changes, args.change))}
    given = dict(zip(changes, args.label_change))  # a change without a label goes by its name
    labels = {"base": args.label_base, **{name: given.get(name, name) for name in changes}}
    rounds = {name: [] for name in builds}
    for r in range(args.rounds):
        for name, command in builds.items():
            log(f"round {r + 1}: {name}")
            rounds[name].append(run_build(args, command))

    points = prefill.points(args, args.sweep)
    peers = {}
    if args.backends:
        import torch
        bench = prefill.TorchBench(args)
        for point in points:
            for backend in args.backends:
                row = bench.measure(point, backend)
                torch.cuda.empty_cache()
                log(prefill.progress(row))
                peers[(backend, point["pass_name"], point["head_dim"], point["causal"], point["seqlen"])] = row["tflops"]
        device = torch.cuda.get_device_name(0)
    else:
        device = gpu_name()

    table = []
    for point in points:
        k = (point["pass_name"], point["head_dim"], point["causal"], point["seqlen"])
        entry = dict(zip(["pass", "head_dim", "causal", "seqlen"], k))
        for name in builds:
            values = [r[k] for r in rounds[name] if r.get(k) is not None]
            entry[name] = statistics.median(values) if values else None
            entry[name + "_rounds"] = values
            entry[name + "_spread"] = spread(values)
        for name in changes:
            entry[f"{name}_over_base"] = entry[name] / entry["base"] if entry["base"] and entry[name] else None
        for backend in args.backends:
            peer = peers.get((backend,) + k)
            entry[backend] = peer
            for name in builds:
                entry[f"{name}_over_{backend}"] = entry[name] / peer if peer and entry[name] else None
        table.append(entry)

    meta = dict(device=device, date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
                base=labels["base"], change=labels["change"], labels=labels, rounds=args.rounds, dtype=args.dtype,
                deterministic=args.deterministic, sweep=args.sweep,
                shape=("B=%d, H=%d" % prefill.small_shape(args)) if args.sweep == "small" else "prefill sweep",
                seconds=round(time.monotonic() - started))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "ab.json"), "w") as f:
        json.dump(dict(meta=meta, points=table), f, indent=1)
    title = ", ".join(labels[n] for n in changes)
    lines = [f"# A/B: {title} against {labels['base']}", "",
             f"- device: {device}", f"- date: {meta['date']}", f"- shapes: {meta['shape']}",
             f"- {args.rounds} alternating rounds per build; TFLOP/s = the median of the rounds' medians; "
             "spread = largest / smallest round of the same build"] + \
        (["- the builds' backward deterministic (`--deterministic`); the peers as usual"] if args.deterministic else []) + [""]
    if len(changes) > 1:
        lines[2:2] = [f"- {name}: {labels[name]}" for name in builds] + [""]
    peer_cols = [f"{b}" for b in args.backends]
    ratio_cols = [f"{n} / {b}" for b in args.backends for n in builds]
    header = ["pass", "D", "mask", "seqlen", "base"]
    for name in changes:
        header += [name, f"{name} / base"]
    header += [f"{n} spread" for n in builds] + peer_cols + ratio_cols
    lines.append("| " + " | ".join(header) + " |")
    lines.append("| --- | --- | --- | --- |" + " ---: |" * (len(header) - 4))
    for e in table:
        cells = [e["pass"], str(e["head_dim"]), "causal" if e["causal"] else "none", str(e["seqlen"]), fmt(e["base"])]
        for name in changes:
            cells += [fmt(e[name]), fmt(e[f"{name}_over_base"], 3)]
        cells += [fmt(e[f"{n}_spread"], 3) for n in builds]
        cells += [fmt(e[b]) for b in args.backends]
        cells += [fmt(e[f"{n}_over_{b}"], 2) for b in args.backends for n in builds]
        lines.append("| " + " | ".join(cells) + " |")
    for name in changes:
        ratios = [e[f"{name}_over_base"] for e in table if e[f"{name}_over_base"]]
        if ratios:
            lines += ["", f"Geometric mean of {name} / base: {statistics.geometric_mean(ratios):.3f} "
                          f"over {len(ratios)} points."]
    with open(os.path.join(args.out_dir, "ab.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
