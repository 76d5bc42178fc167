#!/usr/bin/env python3
"""Decode benchmark (issue 5): cuflash's KV-cache forward against PyTorch SDPA's
flash and cudnn backends and against cuflash's cudnn backend, in one run on one
GPU, as GB/s of K and V read next to the GPU's copy bandwidth.

    python3 bench/decode.py --cuflash build/bin/cuflash [--commit abc1234] [--out-dir docs/perf]

First `cuflash bench --sweep decode --json` (its own process, so that no two
CUDA contexts compete) for backend cuda and cudnn on contiguous caches and
paged ones (page 16 and 64, shuffled block tables); then, in this process,
the device's copy bandwidth (a large device-to-device copy, bytes read plus
written per second) and the PyTorch SDPA peers on a contiguous cache
([B, kv_len, Hk, D] memory seen as [B, Hk, kv_len, D], as flash-attn's
k_cache), timed the same way: per point one checked call, a warm-up, then
calls timed one by one between CUDA events with the L2 cache overwritten
before each, median reported. One query per sequence, no mask (with one query
causal and none are the same function; SDPA's is_causal would align it
top-left). GB/s = 2*B*kv_len*Hk*D*2 bytes (K and V, bf16) / median time, for
every backend alike: a peer that expands K/V for GQA reads more than that, and
its row says so. Writes decode.json and decode.md into --out-dir
(bench/decode_report.py).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (TorchTimer, add_timing_arguments, git_commit, int_list, median, missing_points,  # noqa: E402
                          name_list, run_json_lines, timing_flags)
import decode_report  # noqa: E402

BATCHES = [1, 8, 64, 128]
KV_LENS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
HEAD_PAIRS = ["32/8", "32/32"]
PAGE_SIZES = [0, 16, 64]  # 0: contiguous (the torch peers' layout)
HEAD_DIM = 128
CUFLASH_BACKENDS = {"cuflash_cuda": "cuda", "cuflash_cudnn": "cudnn"}
TORCH_BACKENDS = {"torch_flash": "FLASH_ATTENTION", "torch_cudnn": "CUDNN_ATTENTION"}
DEFAULT_BACKENDS = list(CUFLASH_BACKENDS) + list(TORCH_BACKENDS)
# Left free after a torch point's tensors (and kept free by cuflash bench likewise).
MEMORY_MARGIN = 2 << 30


def log(message: str) -> None:
    print(f"decode: {message}", file=sys.stderr, flush=True)


def kv_bytes(batch: int, kv_len: int, heads_kv: int, head_dim: int) -> float:
    return 2.0 * batch * kv_len * heads_kv * head_dim * 2.0


def head_pair(text: str) -> tuple[int, int]:
    q, kv = text.split("/")
    return int(q), int(kv)


def points(args) -> list[dict]:
    """Every (heads, page size, batch, kv_len) point, in `cuflash bench`'s order."""
    return [dict(batch=b, kv_len=s, heads_q=head_pair(h)[0], heads_kv=head_pair(h)[1], head_dim=args.head_dim,
                 page_size=p)
            for h in args.head_pairs for p in args.page_sizes for b in args.batches for s in args.kv_lens]


def result_row(point: dict, backend: str, *, median_ms=None, reps=0, error=None, skipped=False, first_call_ms=None,
               host_us=None, note=None) -> dict:
    row = dict(backend=backend, reps=reps, error=error, skipped=skipped, median_ms=median_ms, gbps=None,
               first_call_ms=first_call_ms, host_us=host_us, note=note, **point)
    if median_ms is not None and error is None:
        row["gbps"] = kv_bytes(point["batch"], point["kv_len"], point["heads_kv"], point["head_dim"]) / (
            median_ms * 1e-3) / 1e9
    return row


def cuflash_command(args, backends: list[str]) -> list[str]:
    return [args.cuflash, "bench", "--sweep", "decode", "--json",
            "--backend", ",".join(CUFLASH_BACKENDS[b] for b in backends),
            "--head-dim", str(args.head_dim), "--gqa", ",".join(args.head_pairs),
            "--page-size", ",".join(map(str, args.page_sizes)), "--batches", ",".join(map(str, args.batches)),
            "--kv-len", ",".join(map(str, args.kv_lens)), *timing_flags(args)]


def point_key(row: dict) -> tuple:
    return (row["batch"], row["kv_len"], row["heads_q"], row["heads_kv"], row["head_dim"], row["page_size"])


def run_cuflash(args, backends: list[str]) -> list[dict]:
    """All cuflash backends in one `cuflash bench` process; a point it does
    not report gets an error row, so the merge still shows it."""
    results = []

    def add(raw: dict) -> None:
        point = {k: raw[k] for k in ("batch", "kv_len", "heads_q", "heads_kv", "head_dim", "page_size")}
        row = result_row(point, "cuflash_" + raw["backend"], median_ms=raw.get("median_ms"),
                         reps=raw.get("reps", 0), error=raw.get("error"), skipped=raw.get("skipped", False),
                         first_call_ms=raw.get("first_call_ms"), host_us=raw.get("host_us"))
        results.append(row)
        log(progress(row))

    exit_code = run_json_lines(cuflash_command(args, backends), log, add)
    for point, backend in missing_points(results, points(args), backends, point_key, point_key):
        results.append(result_row(point, backend, error=f"no result from `cuflash bench` (exit code {exit_code})"))
    return results


def progress(row: dict) -> str:
    what = (f"{row['backend']:<14} {row['heads_q']}/{row['heads_kv']:<3} page={row['page_size']:<3} "
            f"B={row['batch']:<4} kv={row['kv_len']:<7}")
    if row.get("gbps") is None:
        return f"{what} {'skipped' if row.get('skipped') else 'failed'}: {row.get('error')}"
    return f"{what} {row['gbps']:7.1f} GB/s ({row['median_ms'] * 1e3:.1f} us median of {row['reps']})"


class TorchBench(TorchTimer):
    """The copy bandwidth and the PyTorch SDPA peers, timed like `cuflash bench` times cuflash."""

    def __init__(self, args):
        super().__init__(args, "bf16")

    def copy_gbps(self, gib: float) -> dict:
        """Device-to-device copy of `gib` GiB: (bytes read + bytes written) / median time."""
        torch = self.torch
        count = int(gib * (1 << 30))
        src = torch.empty(count, dtype=torch.uint8, device="cuda").fill_(1)
        dst = torch.empty_like(src)
        median_ms, reps, _ = self.time_calls(lambda: dst.copy_(src), lambda: None)
        del src, dst
        torch.cuda.empty_cache()
        return dict(copy_gbps=2.0 * count / (median_ms * 1e-3) / 1e9, copy_bytes=count, copy_ms=median_ms,
                    copy_reps=reps)

    def fits(self, point: dict) -> tuple[bool, str]:
        torch = self.torch
        free, _ = torch.cuda.mem_get_info()
        b, s, hq, hk, d = (point[k] for k in ("batch", "kv_len", "heads_q", "heads_kv", "head_dim"))
        # The cache, plus an expanded copy of it for a peer without GQA, plus q/out.
        needed = kv_bytes(b, s, hk, d) * (1 + (hq // hk if hq != hk else 0)) + 4 * b * hq * d * 2
        if needed + MEMORY_MARGIN > free:
            return False, (f"skipped: the point's tensors need {int(needed) >> 20} MiB, {free >> 20} MiB of GPU "
                           f"memory are free (keeping {MEMORY_MARGIN >> 20} MiB)")
        return True, ""

    def measure(self, point: dict, backend: str) -> dict:
        torch, F = self.torch, self.F
        ok, reason = self.fits(point)
        if not ok:
            return result_row(point, backend, error=reason, skipped=True)
        b, s, hq, hk, d = (point[k] for k in ("batch", "kv_len", "heads_q", "heads_kv", "head_dim"))
        self.generator.manual_seed(self.args.seed)
        try:
            # [B, 1, Hq, D] and [B, kv_len, Hk, D] memory (flash-attn's layout), seen as [B, H, S, D].
            q = torch.randn(b, 1, hq, d, device="cuda", dtype=self.dtype, generator=self.generator).transpose(1, 2)
            k = torch.randn(b, s, hk, d, device="cuda", dtype=self.dtype, generator=self.generator).transpose(1, 2)
            v = torch.randn(b, s, hk, d, device="cuda", dtype=self.dtype, generator=self.generator).transpose(1, 2)
            attempts = [("enable_gqa", dict(enable_gqa=True) if hq != hk else {}, k, v)]
            if hq != hk:
                attempts.append(("expanded", {}, None, None))
            errors = []
            for how, extra, keys, values in attempts:
                if keys is None:  # GQA as MHA: K/V repeated per query head (reads hq/hk times the bytes)
                    keys = k.repeat_interleave(hq // hk, dim=1)
                    values = v.repeat_interleave(hq // hk, dim=1)
                row = self.measure_call(point, backend, q, keys, values, extra)
                if row["error"] is None:
                    if how == "expanded":
                        row["note"] = (f"K/V expanded to {hq} heads (SDPA {backend} refused enable_gqa: "
                                       f"{errors[0][:200]}); GB/s counts the {hk}-head cache")
                    return row
                errors.append(row["error"])
            return result_row(point, backend, error=" || ".join(errors)[:900])
        except torch.cuda.OutOfMemoryError as error:
            return result_row(point, backend, error=f"out of memory: {str(error).splitlines()[0]}")

    def measure_call(self, point: dict, backend: str, q, k, v, extra: dict) -> dict:
        torch, F = self.torch, self.F
        result = {}

        def call():
            with torch.no_grad():
                result["out"] = F.scaled_dot_product_attention(q, k, v, is_causal=False, **extra)

        with warnings.catch_warnings(record=True) as caught, \
                self.sdpa_kernel(getattr(self.SDPBackend, TORCH_BACKENDS[backend])):
            warnings.simplefilter("always")
            try:
                torch.cuda.synchronize()
                first_start = time.perf_counter()
                call()
                torch.cuda.synchronize()
                first_call_ms = (time.perf_counter() - first_start) * 1e3
            except (RuntimeError, NotImplementedError, ValueError, TypeError) as error:
                # "No available kernel": PyTorch says why in warnings.
                reasons = list(dict.fromkeys(str(w.message).strip() for w in caught))
                message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                return result_row(point, backend, error=" | ".join([message] + reasons)[:600])
            if not bool(torch.isfinite(result["out"]).all()):
                return result_row(point, backend, error="outputs not finite after the call")
            median_ms, reps, host_us = self.time_calls(call, lambda: result.pop("out", None))
        return result_row(point, backend, median_ms=median_ms, reps=reps, first_call_ms=first_call_ms,
                          host_us=host_us)


def parse_args(argv=None):
    def pair_list(text):
        pairs = text.split(",")
        for pair in pairs:
            try:
                q, kv = head_pair(pair)
            except ValueError:
                raise argparse.ArgumentTypeError(f"'{pair}' is not HQ/HK") from None
            if q <= 0 or kv <= 0 or q % kv:
                raise argparse.ArgumentTypeError(f"'{pair}': query heads must be a positive multiple of kv heads")
        return pairs

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--cuflash", default="build/bin/cuflash", help="the cuflash command")
    parser.add_argument("--out-dir", default="docs/perf", help="where decode.json/md go")
    parser.add_argument("--commit", default=os.environ.get("CUFLASH_COMMIT") or None,
                        help="commit named in the report (default: $CUFLASH_COMMIT, else git rev-parse)")
    parser.add_argument("--backends", type=name_list(DEFAULT_BACKENDS), default=DEFAULT_BACKENDS,
                        help=f"comma-separated, of {', '.join(DEFAULT_BACKENDS)}")
    parser.add_argument("--batches", type=int_list, default=BATCHES)
    parser.add_argument("--kv-lens", type=int_list, default=KV_LENS)
    parser.add_argument("--head-pairs", type=pair_list, default=HEAD_PAIRS, help="HQ/HK, comma-separated")
    parser.add_argument("--page-sizes", type=int_list, default=PAGE_SIZES, help="0: contiguous")
    parser.add_argument("--head-dim", type=int, default=HEAD_DIM)
    parser.add_argument("--copy-gib", type=float, default=2.0, help="size of the copy-bandwidth measurement")
    add_timing_arguments(parser, rep_ms=200.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if 0 not in args.page_sizes and any(b in TORCH_BACKENDS for b in args.backends):
        args.page_sizes = [0] + args.page_sizes  # the peers' layout, for the same-layout comparison
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    commit = args.commit or git_commit()
    cuflash_backends = [b for b in args.backends if b in CUFLASH_BACKENDS]
    torch_backends = [b for b in args.backends if b in TORCH_BACKENDS]

    # cuflash first, in its own process, before this one creates a CUDA context.
    results = run_cuflash(args, cuflash_backends) if cuflash_backends else []

    import torch
    if not torch.cuda.is_available():
        log("PyTorch sees no CUDA GPU")
        return 1
    device = torch.cuda.get_device_name(0)
    bench = TorchBench(args)
    copy = bench.copy_gbps(args.copy_gib)
    log(f"copy bandwidth: {copy['copy_gbps']:.0f} GB/s (read + write of {args.copy_gib:g} GiB, "
        f"{copy['copy_ms']:.3f} ms median of {copy['copy_reps']})")
    for point in [p for p in points(args) if p["page_size"] == 0]:
        for backend in torch_backends:
            row = bench.measure(point, backend)
            torch.cuda.empty_cache()  # the point's tensors died with measure()'s frame
            log(progress(row))
            results.append(row)
    del bench
    torch.cuda.empty_cache()

    meta = dict(dtype="bf16", device=device, date=date, commit=commit, torch=torch.__version__, **copy)
    rows = decode_report.merge_rows(results, meta)
    decode_report.write_report(rows, meta, args.out_dir)
    failed = sum(1 for r in results if r.get("gbps") is None and not r.get("skipped"))
    skipped = sum(1 for r in results if r.get("skipped"))
    log(f"{len(rows)} points x {len(args.backends)} backends in {time.monotonic() - started:.0f} s"
        + (f"; {failed} failed" if failed else "") + (f"; {skipped} skipped (memory)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
