"""Linear attention against softmax attention on one GPU: cuflash.linear_attention
(backend cuda), flash-linear-attention's chunk_linear_attn (Triton) and cuDNN
softmax attention (torch SDPA, cuDNN backend, causal), forward and
forward+backward, B*H = 8*16, D = 128, bf16, lengths 1k..64k (the batch shrinks
at long lengths so that every point holds at most --max-tokens tokens per head).

Writes linear_vs_softmax.json (one row per (pass, length)) and
linear_vs_softmax.md (a table per pass, with the crossover: the first length at
which each linear kernel is faster than cuDNN softmax) into --out (default $OUT,
else the current folder), with device, date and commit in the header.

--check: small shapes only; cuflash cuda's output and gradients against fla's
and against cuflash backend cpu. Exit status 1 on a mismatch.

On the GPU machine (no network), from the repository root:
  python -m pip install --no-index --no-deps --target /tmp/deps .whl/einops-*.whl .whl/fla_core-*.whl \
      .whl/flash_linear_attention-*.whl
  PYTHONPATH=/tmp/deps:python python bench/linear_vs_softmax.py --check
  PYTHONPATH=/tmp/deps:python python bench/linear_vs_softmax.py --out $OUT
(cuflash's Python package finds libcuflash as its README says, e.g. after
`pip install --no-build-isolation .`.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

LENGTHS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]
PASSES = ("fwd", "fwdbwd")
KERNELS = ("cuflash_linear", "fla_linear", "cudnn_softmax")


def commit() -> str:
    env = os.environ.get("CUFLASH_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def load_fla():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        return chunk_linear_attn, None
    except Exception as exc:  # reported per point, never fatal
        return None, f"{type(exc).__name__}: {exc}"


def make_inputs(torch, batch, length, heads, dim, dtype, requires_grad, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, length, heads, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def callables(torch, batch, length, heads, dim, dtype, pass_name, fla):
    """{kernel: zero-argument call} for one point; the inputs live as long as the closures."""
    import cuflash
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backward = pass_name == "fwdbwd"
    q, k, v = make_inputs(torch, batch, length, heads, dim, dtype, backward)
    dout = torch.randn_like(q)
    # SDPA's layout is [B, H, S, D]: the transposed views of the same tensors.
    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_(backward) for t in (q, k, v))

    def run(forward):
        if not backward:
            def call():
                with torch.no_grad():
                    forward()
            return call

        def call():
            out = forward()
            out.backward(dout if out.shape == dout.shape else dout.transpose(1, 2))
        return call

    calls = {
        "cuflash_linear": run(lambda: cuflash.linear_attention(q, k, v, causal=True, normalize=False,
                                                               backend="cuda")),
    }
    if fla is not None:
        calls["fla_linear"] = run(lambda: fla(q, k, v, normalize=False)[0])

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    calls["cudnn_softmax"] = run(sdpa)
    return calls


def time_ms(call, warmup_ms, rep_ms) -> float:
    from triton.testing import do_bench
    return float(do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def benchmark(args) -> int:
    import torch
    fla, fla_error = load_fla()
    device = torch.cuda.get_device_name(0)
    rows = []
    for length in args.lengths:
        batch = max(1, min(args.batch, args.max_tokens // length))
        for pass_name in PASSES:
            row = {"pass": pass_name, "seqlen": length, "batch": batch, "heads": args.heads, "head_dim": args.dim,
                   "dtype": "bf16", "causal": True, "median_ms": {}, "errors": {}}
            try:
                calls = callables(torch, batch, length, args.heads, args.dim, torch.bfloat16, pass_name, fla)
            except Exception as exc:
                calls = {}
                row["errors"]["setup"] = f"{type(exc).__name__}: {exc}"
            if fla is None:
                row["errors"]["fla_linear"] = fla_error
            for name, call in calls.items():
                try:
                    row["median_ms"][name] = time_ms(call, args.warmup_ms, args.rep_ms)
                except Exception as exc:
                    row["median_ms"][name] = None
                    row["errors"][name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                torch.cuda.empty_cache()
            del calls
            torch.cuda.empty_cache()
            rows.append(row)
            print(json.dumps(row), flush=True)
    header = {"device": device, "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(),
              "torch": torch.__version__, "heads": args.heads, "head_dim": args.dim, "max_tokens": args.max_tokens}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "linear_vs_softmax.json"), "w") as f:
        json.dump({"header": header, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "linear_vs_softmax.md"), "w") as f:
        f.write(markdown(header, rows))
    print(markdown(header, rows))
    return 0


def crossover(rows, kernel):
    for row in sorted(rows, key=lambda r: r["seqlen"]):
        ms = row["median_ms"]
        if ms.get(kernel) is not None and ms.get("cudnn_softmax") is not None and ms[kernel] < ms["cudnn_softmax"]:
            return row["seqlen"]
    return None


def markdown(header, rows) -> str:
    lines = [f"# Linear vs softmax attention: {header['device']}, {header['date']}, commit {header['commit']}", "",
             f"torch {header['torch']}, H={header['heads']}, D={header['head_dim']}, bf16, causal; batch = "
             f"min(8, {header['max_tokens']} / seqlen) (at least 1). Median ms (CUDA events, triton do_bench).", ""]
    for pass_name in PASSES:
        part = [r for r in rows if r["pass"] == pass_name]
        lines += [f"## {pass_name}", "",
                  "| seqlen | batch | cuflash linear | fla linear | cuDNN softmax | cuflash / fla | cuflash / cuDNN |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in part:
            ms = r["median_ms"]
            cell = lambda name: "fail" if ms.get(name) is None else f"{ms[name]:.3f}"
            ratio = lambda a, b: ("-" if ms.get(a) is None or ms.get(b) is None else f"{ms[a] / ms[b]:.2f}")
            lines.append(f"| {r['seqlen']} | {r['batch']} | {cell('cuflash_linear')} | {cell('fla_linear')} | "
                         f"{cell('cudnn_softmax')} | {ratio('cuflash_linear', 'fla_linear')} | "
                         f"{ratio('cuflash_linear', 'cudnn_softmax')} |")
        for kernel in ("cuflash_linear", "fla_linear"):
            at = crossover(part, kernel)
            lines.append("")
            lines.append(f"Crossover ({pass_name}, {kernel} faster than cuDNN softmax): "
                         f"{at if at is not None else 'none in the measured lengths'}")
        errors = [(r["seqlen"], name, e) for r in part for name, e in r["errors"].items()]
        if errors:
            lines += ["", "Failures:"] + [f"- {s} {name}: {e}" for s, name, e in errors]
        lines.append("")
    return "\n".join(lines) + "\n"


def rel_l2(torch, got, ref) -> float:
    got, ref = got.float(), ref.float()
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def check(args) -> int:
    import torch
    import cuflash
    fla, fla_error = load_fla()
    failures = 0
    shapes = [(2, 100, 4, 64, 64), (1, 300, 2, 128, 128), (2, 65, 2, 64, 128), (1, 1, 2, 128, 64)]
    for dtype, tol in ((torch.bfloat16, 2e-2), (torch.float16, 4e-3)):
        for (b, s, h, dk, dv) in shapes:
            for normalize in (False, True):
                gen = torch.Generator(device="cuda").manual_seed(1)
                q = torch.randn(b, s, h, dk, device="cuda", dtype=dtype, generator=gen)
                k = torch.randn(b, s, h, dk, device="cuda", dtype=dtype, generator=gen)
                if normalize:  # identity features: a normalizer away from 0
                    q, k = q * 0.5 + 1, k * 0.5 + 1
                v = torch.randn(b, s, h, dv, device="cuda", dtype=dtype, generator=gen)
                dout = torch.randn(b, s, h, dv, device="cuda", dtype=dtype, generator=gen)
                results = {}
                for name in ("cuda", "cpu", "fla"):
                    if name == "fla" and fla is None:
                        continue
                    dev = "cpu" if name == "cpu" else "cuda"
                    qi, ki, vi = (t.detach().to(dev).requires_grad_(True) for t in (q, k, v))
                    if name == "fla":
                        out = fla(qi, ki, vi, normalize=normalize)[0]
                    else:
                        out = cuflash.linear_attention(qi, ki, vi, causal=True, normalize=normalize, backend=name)
                    out.backward(dout.to(dev))
                    results[name] = [t.detach().to("cuda") for t in (out, qi.grad, ki.grad, vi.grad)]
                for ref_name in ("cpu", "fla"):
                    if ref_name not in results:
                        continue
                    for what, got, ref in zip(("out", "dq", "dk", "dv"), results["cuda"], results[ref_name]):
                        err = rel_l2(torch, got, ref)
                        ok = err <= (tol if ref_name == "cpu" else 2 * tol)
                        failures += not ok
                        print(f"{'ok  ' if ok else 'FAIL'} {str(dtype)[6:]} B{b} S{s} H{h} Dk{dk} Dv{dv} "
                              f"normalize={normalize} {what} vs {ref_name}: rel-L2 {err:.2e}")
    if fla is None:
        print(f"fla not importable ({fla_error}): compared against backend cpu only")
    print("check:", "FAILED" if failures else "passed")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare outputs on small shapes instead of timing")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".")
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=8 * 8192,
                        help="batch = min(--batch, this / seqlen): 8 up to 8k, then the same tokens")
    parser.add_argument("--warmup-ms", type=int, default=100)
    parser.add_argument("--rep-ms", type=int, default=500)
    args = parser.parse_args()
    return check(args) if args.check else benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
