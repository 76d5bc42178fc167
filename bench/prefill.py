#!/usr/bin/env python3
"""Prefill benchmark: cuflash against PyTorch SDPA's flash (FlashAttention-2),
cudnn and efficient backends, and FlashAttention-4 (`fa4`, its CuTe-DSL
package, where it is importable), in one run on one GPU.

    python3 bench/prefill.py --cuflash build/bin/cuflash [--commit abc1234] [--out-dir docs/perf]

First `cuflash bench --sweep prefill --json` (its own process, so that no two
CUDA contexts compete), then the PyTorch peers on the same shapes, timed the
same way: per point one checked call, a warm-up (>= --warmup-ms and >= 3
calls), then calls timed one by one between CUDA events with the L2 cache
overwritten before each (as triton.testing.do_bench does), median reported.
Then the small shapes (B=1, H=16, S=128 and 512: `"sweep": "small"` rows),
where the per-call time is mostly overhead; for every point also the first
call's host wall time (cudnn builds its graphs then) and the median host time
to launch a call. Writes prefill.json, prefill.md and prefill.png into
--out-dir (see bench/plot_prefill.py; bench/README.md says what is measured).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (TorchTimer, add_timing_arguments, git_commit, int_list, median, missing_points,  # noqa: E402
                          name_list, run_json_lines, timing_flags)
import plot_prefill  # noqa: E402

TOKENS, HIDDEN = 16384, 2048
SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
HEAD_DIMS = [64, 128, 256]
PASSES = ["fwd", "fwdbwd"]
MASKS = ["none", "causal"]
# Report name -> (`cuflash bench --backend`, deterministic backward). The
# deterministic one runs the forward+backward pass only (its forward is the
# default's) and is reported against the default (plot_prefill.TARGETS).
CUFLASH_BACKENDS = {"cuflash_cuda": ("cuda", False), "cuflash_cudnn": ("cudnn", False),
                    "cuflash_cuda_det": ("cuda", True)}
TORCH_BACKENDS = {"torch_flash": "FLASH_ATTENTION", "torch_cudnn": "CUDNN_ATTENTION",
                  "torch_efficient": "EFFICIENT_ATTENTION"}
# Peers outside SDPA, timed by TorchBench like the SDPA ones. fa4:
# FlashAttention-4's CuTe-DSL package (`flash_attn.cute.flash_attn_func`; the
# flash-attn-4 wheel and its compiler, bench/fa4-receive.sh), on [B, S, H, D]
# tensors, its own layout. Not a default: the package is not on the GPU
# machine's image and its kernels compile on each shape family's first call.
OTHER_BACKENDS = {"fa4": "flash_attn.cute.flash_attn_func"}
DEFAULT_BACKENDS = ["cuflash_cuda", "cuflash_cudnn", "torch_flash", "torch_cudnn", "torch_efficient"]
# The small shapes: one sequence of 16 heads, where a call is mostly overhead.
SMALL_BATCH, SMALL_HEADS, SMALL_SEQLENS = 1, 16, [128, 512]
# The small shapes are the Python-path issue's: D = 64 and 128 only.
SMALL_HEAD_DIMS = [64, 128]


def log(message: str) -> None:
    print(f"prefill: {message}", file=sys.stderr, flush=True)


def flops(pass_name: str, batch: int, heads: int, seqlen: int, head_dim: int, causal: bool) -> float:
    count = 4.0 * batch * heads * seqlen * seqlen * head_dim
    if causal:
        count /= 2
    if pass_name == "fwdbwd":
        count *= 3.5
    return count


def head_dims(args, sweep: str) -> list[int]:
    if sweep == "small":
        return [d for d in args.head_dims if d in SMALL_HEAD_DIMS]
    return list(args.head_dims)


def small_shape(args) -> tuple[int, int]:
    """The small sweep's (B, H): SMALL_BATCH / SMALL_HEADS unless args say
    otherwise (bench/ab.py's --batch / --heads, for grids of a few waves)."""
    return getattr(args, "small_batch", None) or SMALL_BATCH, getattr(args, "small_heads", None) or SMALL_HEADS


def points(args, sweep: str = "prefill", passes: list[str] | None = None) -> list[dict]:
    passes = args.passes if passes is None else passes
    if sweep == "small":
        batch, heads = small_shape(args)
        return [dict(pass_name=p, head_dim=d, causal=m == "causal", seqlen=s, batch=batch, heads=heads, sweep="small")
                for p in passes for d in head_dims(args, sweep) for m in args.masks for s in args.small_seqlens]
    return [dict(pass_name=p, head_dim=d, causal=m == "causal", seqlen=s, batch=TOKENS // s, heads=HIDDEN // d)
            for p in passes for d in args.head_dims for m in args.masks for s in args.seqlens]


def run_cuflash(args, backends: list[str], sweep: str = "prefill") -> list[dict]:
    """The cuflash backends in one `cuflash bench` process per backward mode
    (the deterministic one: forward+backward only); a point a process does
    not report gets an error row, so the merge still shows it."""
    results = []
    for deterministic in (False, True):
        group = [b for b in backends if CUFLASH_BACKENDS[b][1] == deterministic]
        passes = [p for p in args.passes if p == "fwdbwd" or not deterministic]
        if group and passes:
            results += run_cuflash_group(args, group, sweep, passes, deterministic)
    return results


def run_cuflash_group(args, backends: list[str], sweep: str, passes: list[str], deterministic: bool) -> list[dict]:
    if sweep == "small":
        batch, heads = small_shape(args)
        shape = ["--batch", str(batch), "--heads", str(heads),
                 "--seqlen", ",".join(map(str, args.small_seqlens))]
    else:
        shape = ["--sweep", "prefill", "--seqlen", ",".join(map(str, args.seqlens))]
    command = [args.cuflash, "bench", *shape, "--json",
               "--backend", ",".join(CUFLASH_BACKENDS[b][0] for b in backends),
               "--pass", ",".join(passes), "--head-dim", ",".join(map(str, head_dims(args, sweep))),
               "--mask", ",".join(args.masks), *timing_flags(args)] + (["--deterministic"] if deterministic else [])
    results = []

    def add(row: dict) -> None:
        row["backend"] = "cuflash_" + row["backend"] + ("_det" if deterministic else "")
        if sweep != "prefill":
            row["sweep"] = sweep
        results.append(row)
        log(progress(row))

    exit_code = run_json_lines(command, log, add)
    missing = missing_points(results, points(args, sweep, passes), backends,
                             lambda r: (r["pass"], r["head_dim"], r["causal"], r["seqlen"]),
                             lambda p: (p["pass_name"], p["head_dim"], p["causal"], p["seqlen"]))
    for point, backend in missing:
        results.append(result_row(point, backend, error=f"no result from `cuflash bench` (exit code {exit_code})"))
    return results


def result_row(point: dict, backend: str, *, median_ms=None, reps=0, error=None, first_call_ms=None,
               host_us=None) -> dict:
    row = dict(backend=backend, reps=reps, error=error, median_ms=median_ms, tflops=None,
               first_call_ms=first_call_ms, host_us=host_us,
               **{("pass" if k == "pass_name" else k): v for k, v in point.items()})
    if median_ms is not None and error is None:
        row["tflops"] = flops(point["pass_name"], point["batch"], point["heads"], point["seqlen"],
                              point["head_dim"], point["causal"]) / (median_ms * 1e-3) / 1e12
    return row


def progress(row: dict) -> str:
    what = (f"{row['backend']:<16} {row['pass']:<6} D={row['head_dim']:<3} "
            f"{'causal' if row['causal'] else 'none  '} S={row['seqlen']:<5}")
    if row.get("tflops") is None:
        return f"{what} failed: {row.get('error')}"
    return f"{what} {row['tflops']:7.1f} TFLOP/s ({row['median_ms']:.4f} ms median of {row['reps']})"


class TorchBench(TorchTimer):
    """The PyTorch SDPA peers, timed like `cuflash bench` times cuflash."""

    def __init__(self, args):
        super().__init__(args, args.dtype)

    def inputs(self, point: dict, requires_grad: bool) -> dict:
        """q, k, v (and dout) of shape [B, H, S, D]: with --torch-layout bshd
        (the default), views of [B, S, H, D] memory, which is what cuflash gets
        and what flash-attn users hand to SDPA (x.transpose(1, 2)); with bhsd,
        contiguous [B, H, S, D] tensors."""
        torch = self.torch
        b, h, s, d = point["batch"], point["heads"], point["seqlen"], point["head_dim"]
        self.generator.manual_seed(self.args.seed)

        def make():
            if self.args.torch_layout == "bshd":
                x = torch.randn(b, s, h, d, device="cuda", dtype=self.dtype, generator=self.generator).transpose(1, 2)
            else:
                x = torch.randn(b, h, s, d, device="cuda", dtype=self.dtype, generator=self.generator)
            return x.detach().requires_grad_(requires_grad)  # a leaf, strides kept

        tensors = dict(q=make(), k=make(), v=make())
        if requires_grad:
            tensors["dout"] = make().detach()
        return tensors

    def attention(self, backend: str):
        """The function a peer is timed on, as attention(q, k, v, causal) on
        [B, H, S, D] tensors, and the context it runs in; or an error string
        when the peer cannot be loaded."""
        F = self.F
        if backend in TORCH_BACKENDS:
            return (lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    self.sdpa_kernel(getattr(self.SDPBackend, TORCH_BACKENDS[backend])))
        if backend == "fa4":
            try:
                from flash_attn.cute import flash_attn_func
            except Exception as error:  # noqa: BLE001 (any import failure: the peer is absent)
                return f"flash_attn.cute not importable: {type(error).__name__}: {error}"[:600]

            def fa4(q, k, v, causal):
                # flash-attn takes [B, S, H, D]: the transposes are views
                # (with --torch-layout bshd, of the contiguous memory that
                # cuflash gets too); it returns (out, lse).
                out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
                return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
            return fa4, contextlib.nullcontext()
        raise ValueError(f"unknown peer backend {backend}")

    def measure(self, point: dict, backend: str) -> dict:
        torch = self.torch
        fwdbwd = point["pass_name"] == "fwdbwd"
        causal = point["causal"]
        peer = self.attention(backend)
        if isinstance(peer, str):
            return result_row(point, backend, error=peer)
        attention, context = peer
        try:
            with warnings.catch_warnings(record=True) as caught, context:
                warnings.simplefilter("always")
                tensors = self.inputs(point, requires_grad=fwdbwd)
                q, k, v = tensors["q"], tensors["k"], tensors["v"]
                if fwdbwd:
                    dout = tensors["dout"]

                    def call():
                        # A fresh graph per call, freed by backward (nothing retained).
                        attention(q, k, v, causal).backward(dout)

                    def before():
                        q.grad = k.grad = v.grad = None  # so that backward writes, not accumulates
                    outputs = lambda: [q.grad, k.grad, v.grad]  # noqa: E731
                else:
                    result = {}

                    def call():
                        with torch.no_grad():
                            result["out"] = attention(q, k, v, causal)

                    def before():
                        result.pop("out", None)
                    outputs = lambda: [result["out"]]  # noqa: E731
                try:
                    torch.cuda.synchronize()
                    first_start = time.perf_counter()
                    before()
                    call()
                    torch.cuda.synchronize()
                    first_call_ms = (time.perf_counter() - first_start) * 1e3
                except (RuntimeError, NotImplementedError, ValueError, AssertionError) as error:
                    # "No available kernel": PyTorch says why in warnings.
                    reasons = list(dict.fromkeys(str(w.message).strip() for w in caught))
                    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    return result_row(point, backend, error=" | ".join([message] + reasons)[:600])
                if not all(bool(torch.isfinite(x).all()) for x in outputs()):
                    return result_row(point, backend, error="outputs not finite after the call")
                median_ms, reps, host_us = self.time_calls(call, before)
                return result_row(point, backend, median_ms=median_ms, reps=reps, first_call_ms=first_call_ms,
                                  host_us=host_us)
        except torch.cuda.OutOfMemoryError as error:
            return result_row(point, backend, error=f"out of memory: {str(error).splitlines()[0]}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--cuflash", default="build/bin/cuflash", help="the cuflash command")
    parser.add_argument("--out-dir", default="docs/perf", help="where prefill.json/md/png go")
    parser.add_argument("--commit", default=os.environ.get("CUFLASH_COMMIT") or None,
                        help="commit named in the report (default: $CUFLASH_COMMIT, else git rev-parse)")
    all_backends = list(CUFLASH_BACKENDS) + list(TORCH_BACKENDS) + list(OTHER_BACKENDS)
    parser.add_argument("--backends", type=name_list(all_backends), default=DEFAULT_BACKENDS,
                        help=f"comma-separated, of {', '.join(all_backends)}")
    parser.add_argument("--passes", type=name_list(PASSES), default=PASSES)
    parser.add_argument("--head-dims", type=int_list, default=HEAD_DIMS)
    parser.add_argument("--masks", type=name_list(MASKS), default=MASKS)
    parser.add_argument("--seqlens", type=int_list, default=SEQLENS)
    parser.add_argument("--small-seqlens", type=int_list, default=SMALL_SEQLENS,
                        help=f"the small shapes' lengths (B={SMALL_BATCH}, H={SMALL_HEADS}); '' for none")
    parser.add_argument("--dtype", choices=["bf16"], default="bf16")
    parser.add_argument("--torch-layout", choices=["bshd", "bhsd"], default="bshd",
                        help="PyTorch inputs: [B,H,S,D] views of [B,S,H,D] memory (as cuflash), or contiguous")
    add_timing_arguments(parser, rep_ms=300.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-small", action="store_true", help="skip the small shapes")
    args = parser.parse_args(argv)
    if args.no_small:
        args.small_seqlens = []
    for s in args.seqlens:
        if s <= 0 or TOKENS % s:
            parser.error(f"--seqlens: {s} does not divide {TOKENS} tokens")
    for d in args.head_dims:
        if d <= 0 or HIDDEN % d:
            parser.error(f"--head-dims: {d} does not divide hidden {HIDDEN}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
    commit = args.commit or git_commit()
    cuflash_backends = [b for b in args.backends if b in CUFLASH_BACKENDS]
    peer_backends = [b for b in args.backends if b in TORCH_BACKENDS or b in OTHER_BACKENDS]

    # cuflash first, in its own processes, before this one creates a CUDA context.
    sweeps = ["prefill"] + (["small"] if args.small_seqlens else [])
    results = []
    for sweep in sweeps:
        results += run_cuflash(args, cuflash_backends, sweep) if cuflash_backends else []
    cuflash_device = next((r["device"] for r in results if r.get("device")), None)

    import torch
    if not torch.cuda.is_available():
        log("PyTorch sees no CUDA GPU")
        return 1
    device = torch.cuda.get_device_name(0)
    if cuflash_device and cuflash_device != device:
        log(f"note: cuflash reported device '{cuflash_device}', PyTorch '{device}'")
    if peer_backends:
        bench = TorchBench(args)
        for point in [p for sweep in sweeps for p in points(args, sweep)]:
            for backend in peer_backends:
                row = bench.measure(point, backend)
                torch.cuda.empty_cache()  # the point's tensors died with measure()'s frame
                log(progress(row))
                results.append(row)
        del bench
        torch.cuda.empty_cache()

    meta = dict(dtype=args.dtype, device=device, date=date, commit=commit, torch=torch.__version__,
                layout=args.torch_layout)
    rows = plot_prefill.merge_rows(results, meta)
    plot_prefill.write_report(rows, args.out_dir)
    failed = sum(1 for r in results if r.get("tflops") is None)
    log(f"{len(rows)} points x {len(args.backends)} backends in {time.monotonic() - started:.0f} s"
        + (f"; {failed} failed (listed in prefill.md)" if failed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
