"""Linear attention against softmax attention on one GPU, in one run:
cuflash.linear_attention (backend cuda), flash-linear-attention's
chunk_linear_attn (Triton; the same function: identity φ, normalize=False,
scale 1/sqrt(D)), cuflash's softmax attention (cuflash.attention, backend cuda)
and cuDNN softmax attention (torch SDPA, cuDNN backend), causal, forward and
forward+backward, H = 16, D = 128, bf16.

Series (--series): "tokens16k", batch = max(1, 16384 / seqlen); "b1", batch 1.
Lengths 512 .. 128k (--lengths), plus --linear-only-lengths (1M) where the
softmax kernels are not attempted, nor above --softmax-max-len: quadratic, the
table says "skipped (quadratic)". A point whose (pass, seqlen, batch) an earlier
series measured is not measured again (both series have batch 1 from 16k on).
Then decode (--decode-contexts x --decode-batches): one step per sequence, the
linear kernels' state update (cuflash.linear_attention_step, in place; fla's
fused_recurrent_linear_attn over one token) against softmax over a KV cache of
`context` keys (cuflash.attention with the cache, backend cuda; torch SDPA's
cuDNN and flash backends).

Times: triton.testing.do_bench medians (CUDA events, after its warm-up);
tokens/s = batch * seqlen / time (decode: batch / time per step). A CUDA
out-of-memory error is recorded for its kernel and point, and the run goes on.
Writes linear_vs_softmax.json and linear_vs_softmax.md into --out (default
$OUT, else the current folder) after every point, so that a run cut short
still leaves what it measured; one JSON line per point on stdout as it goes.
--plot also draws linear_vs_softmax.png (needs matplotlib; without it the run
still succeeds, and bench/plot_linear.py draws it later from the json).

--report JSON: no GPU needed; writes linear.md (the tables, crossovers, decode,
and the specification's estimates beside the measured numbers), linear.json (a
copy of JSON) and, with matplotlib, linear.png into --out.

--check: small shapes only; cuflash cuda's output and gradients against fla's
and against cuflash backend cpu. Exit status 1 on a mismatch.

On the GPU machine (no network), from the repository root:
  python3 -m pip install -q --no-index --no-deps --no-compile --target /root/deps .whl/*.whl
  PYTHONPATH=/root/pkg:/root/deps python3 bench/linear_vs_softmax.py --check
  CUFLASH_COMMIT=<sha> PYTHONPATH=/root/pkg:/root/deps python3 bench/linear_vs_softmax.py --out $OUT --plot
Then, anywhere:
  python3 bench/linear_vs_softmax.py --report $OUT/linear_vs_softmax.json --out docs/perf
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.util
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

LENGTHS = [512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
LINEAR_ONLY_LENGTHS = [1048576]
SOFTMAX_MAX_LEN = 131072
TOKENS_PER_BATCH = 16384
SERIES = ("tokens16k", "b1")
PASSES = ("fwd", "fwdbwd")
LINEAR_KERNELS = ("cuflash_linear", "fla_linear")
SOFTMAX_KERNELS = ("cuflash_softmax", "cudnn_softmax")
KERNELS = LINEAR_KERNELS + SOFTMAX_KERNELS
DECODE_CONTEXTS = [4096, 16384, 65536, 131072]
DECODE_BATCHES = [1, 16]
# flash_softmax: SDPA's flash backend, a second softmax peer for decode only,
# where flash-attn's kernel is the usual one.
DECODE_KERNELS = KERNELS + ("flash_softmax",)
LABELS = {
    "cuflash_linear": "cuflash linear",
    "fla_linear": "fla linear",
    "cuflash_softmax": "cuflash softmax",
    "cudnn_softmax": "cuDNN softmax",
    "flash_softmax": "flash softmax",
}
DECODE_LABELS = {
    "cuflash_linear": "cuflash linear step",
    "fla_linear": "fla recurrent step",
    "cuflash_softmax": "cuflash softmax KV cache",
    "cudnn_softmax": "cuDNN SDPA",
    "flash_softmax": "flash SDPA",
}
SERIES_TEXT = {"tokens16k": f"{TOKENS_PER_BATCH // 1024}k tokens per batch (batch = max(1, "
                            f"{TOKENS_PER_BATCH} / seqlen))",
               "b1": "batch 1"}
PASS_TEXT = {"fwd": "forward", "fwdbwd": "forward + backward"}
SKIPPED_QUADRATIC = "quadratic"
OOM_PREFIX = "out of memory: "
CROSSOVER_DEFINITION = ("Crossover: the first measured length from which the linear kernel is faster than the "
                        "softmax kernel at that length and at every longer length where both were measured "
                        "(skipped or failed cells do not count); \"none\" when it is not faster at the longest "
                        "length measured for both.")

# The specification document's estimates (seed file 001_26dad5e43f764026.txt,
# "cuDNN Flash Attention Setup"): per length, cuDNN FlashAttention's throughput
# from its "Performance Expectations" list and from its "Expected Results with
# cuDNN" table ("cuDNN FA (est)"), its linear attention's throughput, and the
# speedups it claimed in those two places. --report sets them beside the
# measured numbers; tokens/s as the seed wrote them (it names no batch, heads,
# head dim or pass).
SPEC_ESTIMATES = [
    {"seqlen": 2048, "cudnn_expected": 500e3, "cudnn_est": 50, "linear": 2.0e6, "speedups": "4× / 40×"},
    {"seqlen": 8192, "cudnn_expected": 120e3, "cudnn_est": 200, "linear": 2.1e6, "speedups": "17× / 10,500×"},
    {"seqlen": 32768, "cudnn_expected": 30e3, "cudnn_est": 600, "linear": 2.15e6, "speedups": "— / 3,580×"},
    {"seqlen": 131072, "cudnn_expected": 7e3, "cudnn_est": 8500, "linear": 1.87e6, "speedups": "271× / 220×"},
]
# The same seed's other claims: where linear attention overtakes cuDNN, and its
# own naive FlashAttention at 128k against its linear attention.
SPEC_CROSSOVER = "likely around 8-16K tokens; also: linear attention wins at all tested lengths"
SPEC_NAIVE_FA_128K_TOKENS_PER_S = 85
SPEC_NAIVE_SPEEDUP_128K = "22,120×"


def commit() -> str:
    env = os.environ.get("CUFLASH_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL, cwd=HERE).strip()
    except Exception:
        return "unknown"


def load_fla():
    try:
        from fla.ops.linear_attn import chunk_linear_attn
        return chunk_linear_attn, None
    except Exception as exc:  # reported per point, never fatal
        return None, f"{type(exc).__name__}: {exc}"


def load_fla_step():
    """fla's recurrent linear attention, which over one token is its decode step."""
    try:
        from fla.ops.linear_attn import fused_recurrent_linear_attn
        return fused_recurrent_linear_attn, None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def fla_version() -> str | None:
    try:
        import fla
        return getattr(fla, "__version__", "unknown")
    except Exception:
        return None


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

    def run(forward, leaves):
        if not backward:
            def call():
                with torch.no_grad():
                    forward()
            return call

        def call():
            # Gradients written, not accumulated (as bench/prefill.py times them):
            # an accumulation would add a pass over dq, dk, dv to every call.
            for leaf in leaves:
                leaf.grad = None
            out = forward()
            out.backward(dout if out.shape == dout.shape else dout.transpose(1, 2))
        return call

    calls = {
        "cuflash_linear": run(lambda: cuflash.linear_attention(q, k, v, causal=True, normalize=False,
                                                               backend="cuda"), (q, k, v)),
    }
    if fla is not None:
        calls["fla_linear"] = run(lambda: fla(q, k, v, normalize=False)[0], (q, k, v))
    calls["cuflash_softmax"] = run(lambda: cuflash.attention(q, k, v, causal=True, backend="cuda"), (q, k, v))

    def sdpa():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    calls["cudnn_softmax"] = run(sdpa, (qs, ks, vs))
    return calls


def decode_callables(torch, batch, context, heads, dim, dtype, fla_step):
    """{kernel: zero-argument call} for one decode step of `batch` sequences at `context` keys."""
    import cuflash
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn((batch, 1, heads, dim), device="cuda", dtype=dtype, generator=gen) for _ in range(3))
    # The linear state is the same size at every context. It starts at zeros and
    # every timed step adds the same k vᵀ into it: it grows linearly, far from fp32's range.
    state = torch.zeros((batch, heads, dim, dim), device="cuda", dtype=torch.float32)
    k_cache, v_cache = (torch.randn((batch, context, heads, dim), device="cuda", dtype=dtype, generator=gen)
                        for _ in range(2))
    # cuflash appends the step's k/v at position context - 1, so that it attends
    # to `context` keys, as SDPA does over the whole cache; the append lands in
    # the same row at every call.
    cached = torch.full((batch,), context - 1, device="cuda", dtype=torch.int32)
    qs, ks, vs = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)

    def sdpa(backend):
        def call():
            # One query row sees every key: no mask (SDPA's is_causal would align it top-left).
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(qs, ks, vs)
        return call

    calls = {"cuflash_linear": lambda: cuflash.linear_attention_step(q, k, v, state, backend="cuda")}
    if fla_step is not None:
        # Not in place: fla returns the new state as a new tensor.
        calls["fla_linear"] = lambda: fla_step(q, k, v, initial_state=state, output_final_state=True,
                                               normalize=False)
    # cuflash.attention rather than flash_attn_with_kvcache (the same call
    # underneath): it takes backend="cuda", where backend auto may pick cuDNN.
    calls["cuflash_softmax"] = lambda: cuflash.attention(q, k_cache, v_cache, seqlens_k=cached, k_new=k, v_new=v,
                                                         backend="cuda")
    calls["cudnn_softmax"] = sdpa(SDPBackend.CUDNN_ATTENTION)
    calls["flash_softmax"] = sdpa(SDPBackend.FLASH_ATTENTION)

    def no_grad(call):
        def wrapped():
            with torch.no_grad():
                call()
        return wrapped
    return {name: no_grad(call) for name, call in calls.items()}


def time_ms(call, warmup_ms, rep_ms) -> float:
    from triton.testing import do_bench
    return float(do_bench(call, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def failure_text(torch, exc) -> str:
    text = f"{type(exc).__name__}: {str(exc)[:300]}"
    out_of_memory = isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()
    return OOM_PREFIX + text if out_of_memory else text


def release(torch) -> None:
    """Frees what a point (or a failed call's traceback) held, before the next one allocates."""
    gc.collect()
    torch.cuda.empty_cache()


def new_row(series, pass_name, length, batch, args) -> dict:
    return {"series": series, "pass": pass_name, "seqlen": length, "batch": batch, "heads": args.heads,
            "head_dim": args.dim, "dtype": "bf16", "causal": pass_name != "decode", "median_ms": {},
            "tokens_per_s": {}, "errors": {}, "skipped": {}}


def time_kernels(torch, args, row, kernels, make_calls, tokens) -> None:
    """Times each of `kernels` that is neither skipped nor already failed in
    `row`; `tokens`: tokens one call processes (for tokens/s)."""
    wanted = [k for k in kernels if k not in row["skipped"] and k not in row["errors"]]
    try:
        calls = make_calls()
    except Exception as exc:
        calls = {}
        for name in wanted:
            row["errors"][name] = failure_text(torch, exc)
    for name in wanted:
        if name not in calls:
            row["errors"].setdefault(name, "no call for this kernel")
            continue
        try:
            row["median_ms"][name] = time_ms(calls[name], args.warmup_ms, args.rep_ms)
        except Exception as exc:
            row["errors"][name] = failure_text(torch, exc)
        if name in row["errors"]:
            release(torch)  # out here, where the failure's traceback (and what its frames held) is gone
    del calls
    release(torch)
    for name in kernels:
        ms = row["median_ms"].setdefault(name, None)
        row["tokens_per_s"][name] = None if ms is None else tokens / (ms * 1e-3)


def series_batch(series: str, length: int) -> int:
    return max(1, TOKENS_PER_BATCH // length) if series == "tokens16k" else 1


def write_outputs(out_dir, header, rows) -> None:
    """The json and the markdown, each replaced whole so that a run killed mid-write leaves the last good one."""
    os.makedirs(out_dir, exist_ok=True)
    for name, text in (("linear_vs_softmax.json", json.dumps({"header": header, "rows": rows}, indent=1)),
                       ("linear_vs_softmax.md", markdown(header, rows))):
        path = os.path.join(out_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def benchmark(args) -> int:
    import torch
    import triton
    fla, fla_error = load_fla()
    fla_step, fla_step_error = load_fla_step()
    header = {"device": torch.cuda.get_device_name(0), "date": datetime.datetime.now().isoformat(timespec="seconds"),
              "commit": commit(), "torch": torch.__version__, "triton": triton.__version__, "fla": fla_version(),
              "heads": args.heads, "head_dim": args.dim, "dtype": "bf16", "tokens_per_batch": TOKENS_PER_BATCH,
              "softmax_max_len": args.softmax_max_len, "linear_only_lengths": args.linear_only_lengths,
              "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
              "timer": "triton.testing.do_bench, median of CUDA-event times", "complete": False}
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        write_outputs(args.out, header, rows)

    prefill_kernels = [k for k in KERNELS if k in args.kernels]
    measured = {}  # (pass, seqlen, batch) -> the row that measured it, reused by a later series
    for series in args.series:
        for length in sorted(set(args.lengths) | set(args.linear_only_lengths)):
            batch = series_batch(series, length)
            for pass_name in PASSES:
                earlier = measured.get((pass_name, length, batch))
                if earlier is not None:
                    record(dict(earlier, series=series, same_point_as=earlier["series"]))
                    continue
                row = new_row(series, pass_name, length, batch, args)
                if length > args.softmax_max_len or length in args.linear_only_lengths:
                    for name in SOFTMAX_KERNELS:
                        if name in prefill_kernels:
                            row["skipped"][name] = SKIPPED_QUADRATIC
                if fla is None and "fla_linear" in prefill_kernels:
                    row["errors"]["fla_linear"] = fla_error
                time_kernels(torch, args, row, prefill_kernels,
                             lambda: callables(torch, batch, length, args.heads, args.dim, torch.bfloat16,
                                               pass_name, fla),
                             batch * length)
                measured[(pass_name, length, batch)] = row
                record(row)
    decode_kernels = [k for k in DECODE_KERNELS if k in args.kernels]
    for batch in args.decode_batches:
        for context in args.decode_contexts:
            row = new_row("decode", "decode", context, batch, args)
            if fla_step is None and "fla_linear" in decode_kernels:
                row["errors"]["fla_linear"] = fla_step_error
            time_kernels(torch, args, row, decode_kernels,
                         lambda: decode_callables(torch, batch, context, args.heads, args.dim, torch.bfloat16,
                                                  fla_step),
                         batch)
            record(row)
    header["complete"] = True
    write_outputs(args.out, header, rows)
    print(markdown(header, rows))
    if args.plot:
        print(plot(header, rows, os.path.join(args.out, "linear_vs_softmax.png")))
    return 0


def plot(header, rows, path) -> str:
    """Draws the plot; a sentence saying what happened (never raises for a missing matplotlib)."""
    # Loaded by path, not through sys.path: a test process that imports this
    # module must not find bench/'s other modules (bench/test_ring.py) first.
    spec = importlib.util.spec_from_file_location("plot_linear", os.path.join(HERE, "plot_linear.py"))
    plot_linear = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_linear)
    try:
        plot_linear.draw({"header": header, "rows": rows}, path)
    except ImportError as exc:
        return (f"no plot ({exc}); draw it elsewhere with: python3 bench/plot_linear.py "
                f"<the json> {os.path.basename(path)}")
    return f"wrote {path}"


# ---- The report: pure functions of the json's header and rows. ----

def length_label(length: int) -> str:
    if length % (1 << 20) == 0:
        return f"{length >> 20}M"
    if length % 1024 == 0:
        return f"{length >> 10}k"
    return str(length)


def rate_label(tokens_per_s) -> str:
    if tokens_per_s is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens_per_s >= scale:
            return f"{tokens_per_s / scale:.3g}{suffix}"
    return f"{tokens_per_s:.3g}"


def cell(row, kernel, scale=1.0, digits=3) -> str:
    """A time cell: the number, or why there is none."""
    if kernel in row.get("skipped", {}):
        return f"skipped ({row['skipped'][kernel]})"
    error = row["errors"].get(kernel)
    if error is not None:
        return "OOM" if error.startswith(OOM_PREFIX) else "fail"
    ms = row["median_ms"].get(kernel)
    return "-" if ms is None else f"{ms * scale:.{digits}f}"


def ratio(row, numerator, denominator) -> str:
    ms = row["median_ms"]
    if ms.get(numerator) is None or ms.get(denominator) is None:
        return "-"
    return f"{ms[numerator] / ms[denominator]:.3g}"


def groups(rows) -> list[tuple[str, str]]:
    """(series, pass) pairs of the prefill rows, in the order the run made them."""
    seen = []
    for row in rows:
        key = (row["series"], row["pass"])
        if row["series"] != "decode" and key not in seen:
            seen.append(key)
    return seen


def part(rows, series, pass_name) -> list[dict]:
    return sorted((r for r in rows if r["series"] == series and r["pass"] == pass_name), key=lambda r: r["seqlen"])


def comparisons(rows, kernel, reference) -> list[tuple[int, bool]]:
    """(seqlen, kernel faster than reference) at each length where both have a time, shortest first."""
    out = []
    for row in sorted(rows, key=lambda r: r["seqlen"]):
        ms = row["median_ms"]
        if ms.get(kernel) is not None and ms.get(reference) is not None:
            out.append((row["seqlen"], ms[kernel] < ms[reference]))
    return out


def crossover(rows, kernel, reference="cudnn_softmax"):
    """The first length from which `kernel` is faster than `reference` at every
    longer length where both were measured; None when it is not faster at the
    longest such length (or none was measured for both)."""
    start = None
    for length, faster in comparisons(rows, kernel, reference):
        if not faster:
            start = None
        elif start is None:
            start = length
    return start


def crossover_text(rows, kernel, reference) -> str:
    compared = comparisons(rows, kernel, reference)
    if not compared:
        return "not compared"
    at = crossover(rows, kernel, reference)
    if at is None:
        return f"none (slower at {length_label(compared[-1][0])})"
    if at == compared[0][0]:
        return f"≤ {length_label(at)} (faster at every measured length)"
    return length_label(at)


def timing_table(rows, kernels, labels, first_column, unit, ratios, **cell_format) -> list[str]:
    """A table of times, one row per point: the length and batch, each kernel's time (`unit`, cell's
    `cell_format`), cuflash linear's ratio to each (header, kernel) of `ratios`, each kernel's tokens/s."""
    lines = ["| " + first_column + " | batch | " + " | ".join(f"{labels[k]} {unit}" for k in kernels)
             + " | " + " | ".join(header for header, _ in ratios) + " | "
             + " | ".join(f"{labels[k]} tok/s" for k in kernels) + " |",
             "| " + " | ".join(["---:"] * (2 + len(ratios) + 2 * len(kernels))) + " |"]
    for r in rows:
        lines.append(f"| {length_label(r['seqlen'])} | {r['batch']} | "
                     + " | ".join(cell(r, k, **cell_format) for k in kernels)
                     + " | " + " | ".join(ratio(r, "cuflash_linear", other) for _, other in ratios) + " | "
                     + " | ".join(rate_label(r["tokens_per_s"].get(k)) for k in kernels) + " |")
    return lines


def prefill_tables(rows) -> list[str]:
    lines = []
    for series, pass_name in groups(rows):
        rows_here = part(rows, series, pass_name)
        kernels = [k for k in KERNELS if any(k in r["median_ms"] or k in r.get("skipped", {}) for r in rows_here)]
        lines += [f"## {PASS_TEXT.get(pass_name, pass_name)}, {SERIES_TEXT.get(series, series)}", "",
                  "Median ms per call; tokens/s = batch × seqlen / time; ratios of times (below 1: cuflash linear "
                  "is faster).", ""]
        lines += timing_table(rows_here, kernels, LABELS, "seqlen", "ms",
                              [("cuflash linear / fla", "fla_linear"), ("cuflash linear / cuDNN", "cudnn_softmax")])
        shared = sorted({r["same_point_as"] for r in rows_here if "same_point_as" in r})
        if shared:
            lines += ["", f"Rows with the batch of an earlier series are that series' measurement "
                          f"({', '.join(shared)}), not a second one."]
        lines.append("")
    return lines


def crossover_table(rows) -> list[str]:
    pairs = [(k, ref) for k in LINEAR_KERNELS for ref in ("cudnn_softmax", "cuflash_softmax")]
    lines = ["## Crossover", "", CROSSOVER_DEFINITION, "",
             "| series | pass | " + " | ".join(f"{LABELS[k]} vs {LABELS[ref]}" for k, ref in pairs) + " |",
             "| --- | --- | " + " | ".join(["---"] * len(pairs)) + " |"]
    for series, pass_name in groups(rows):
        rows_here = part(rows, series, pass_name)
        lines.append(f"| {series} | {pass_name} | "
                     + " | ".join(crossover_text(rows_here, k, ref) for k, ref in pairs) + " |")
    return lines + [""]


def decode_table(rows) -> list[str]:
    decode = sorted((r for r in rows if r["series"] == "decode"), key=lambda r: (r["batch"], r["seqlen"]))
    if not decode:
        return []
    kernels = [k for k in DECODE_KERNELS if any(k in r["median_ms"] for r in decode)]
    lines = ["## Decode: one step per sequence", "",
             "One new token per sequence: the linear kernels update their state (cuflash in place; fla's "
             "recurrent kernel over one token returns a new state), whose size does not depend on the context; "
             "softmax reads a KV cache of `context` keys (cuflash: the step's k/v appended into the cache, "
             "backend cuda; SDPA: one query row over the cache, no mask). µs per step (median); "
             "tokens/s = batch / step time; ratios of times (below 1: the linear step is faster).", ""]
    lines += timing_table(decode, kernels, DECODE_LABELS, "context", "µs",
                          [("cuflash linear / cuflash softmax", "cuflash_softmax"),
                           ("cuflash linear / cuDNN", "cudnn_softmax")], scale=1e3, digits=1)
    return lines + [""]


def failures(rows) -> list[str]:
    """Each distinct failure once, with the points where it happened (a missing fla fails everywhere)."""
    where: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if "same_point_as" in r:
            continue  # listed under the series that measured it
        for kernel, error in r["errors"].items():
            what = r["series"] if r["series"] == r["pass"] else f"{r['series']} {r['pass']}"
            where.setdefault((kernel, error), []).append(f"{what} {length_label(r['seqlen'])} B={r['batch']}")
    if not where:
        return []
    lines = ["## Failures", ""]
    for (kernel, error), points in where.items():
        at = ", ".join(points) if len(points) <= 4 else f"{len(points)} points ({points[0]} ... {points[-1]})"
        lines.append(f"- {kernel} at {at}: {error}")
    return lines + [""]


def conditions(header) -> str:
    return (f"torch {header.get('torch', '?')}, triton {header.get('triton', '?')}, "
            f"fla {header.get('fla') or 'not importable'}; H={header['heads']}, D={header['head_dim']}, "
            f"{header.get('dtype', 'bf16')}, causal, φ identity, normalize=False. Softmax kernels are not run above "
            f"{length_label(header.get('softmax_max_len', SOFTMAX_MAX_LEN))} tokens nor at the linear-only lengths "
            f"({', '.join(length_label(n) for n in header.get('linear_only_lengths', [])) or 'none'}): "
            f"\"skipped (quadratic)\". Times: {header.get('timer', 'triton.testing.do_bench')} (warm-up "
            f"{header.get('warmup_ms', '?')} ms, repetitions {header.get('rep_ms', '?')} ms).")


def partial_note(header) -> list[str]:
    if header.get("complete", True):
        return []
    return ["**Partial run**: the benchmark had not finished when this was written.", ""]


def markdown(header, rows) -> str:
    lines = [f"# Linear vs softmax attention: {header['device']}, {header['date']}, commit {header['commit']}", "",
             conditions(header), ""]
    lines += partial_note(header)
    lines += prefill_tables(rows) + crossover_table(rows) + decode_table(rows) + failures(rows)
    return "\n".join(lines) + "\n"


def measured_at(rows, series, pass_name, length):
    for r in rows:
        if r["series"] == series and r["pass"] == pass_name and r["seqlen"] == length:
            return r
    return None


def spec_section(rows) -> list[str]:
    """The seed's estimates beside the forward pass measured on one sequence (or,
    without the b1 series, the tokens16k one) at the same lengths."""
    series = "b1" if any(r["series"] == "b1" for r in rows) else "tokens16k"
    lines = ["## Against the specification's estimates", "",
             "The specification (its notes \"cuDNN Flash Attention Setup\") estimated cuDNN FlashAttention's "
             "throughput twice (a \"Performance Expectations\" list and an \"Expected Results with cuDNN\" table, "
             "\"cuDNN FA (est)\"), its linear attention's, and the speedups below (expectations / est. table). "
             "It names no batch, head count, head dim or pass; the measured columns are the forward pass of "
             f"series {series} ({SERIES_TEXT[series]}), H=16, D=128, bf16, tokens/s over all heads. "
             "Speedup = cuDNN softmax time / linear time.", "",
             "| seqlen | cuDNN FA tok/s (expected) | cuDNN FA tok/s (est.) | linear tok/s (spec) | speedup (spec) "
             "| cuDNN softmax tok/s | cuflash softmax tok/s | cuflash linear tok/s | fla linear tok/s "
             "| speedup, cuflash linear | speedup, fla linear |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for estimate in SPEC_ESTIMATES:
        row = measured_at(rows, series, "fwd", estimate["seqlen"])
        rates = row["tokens_per_s"] if row is not None else {}
        speedups = [ratio(row, "cudnn_softmax", k) if row is not None else "-" for k in LINEAR_KERNELS]
        speedups = [s if s == "-" else f"{s}×" for s in speedups]
        lines.append(f"| {length_label(estimate['seqlen'])} | {rate_label(estimate['cudnn_expected'])} | "
                     f"{rate_label(estimate['cudnn_est'])} | {rate_label(estimate['linear'])} | "
                     f"{estimate['speedups']} | {rate_label(rates.get('cudnn_softmax'))} | "
                     f"{rate_label(rates.get('cuflash_softmax'))} | {rate_label(rates.get('cuflash_linear'))} | "
                     f"{rate_label(rates.get('fla_linear'))} | {speedups[0]} | {speedups[1]} |")
    at_128k = measured_at(rows, series, "fwd", 131072)
    cuflash_softmax_128k = rate_label(at_128k["tokens_per_s"].get("cuflash_softmax")) if at_128k else "-"
    crossovers = "; ".join(
        f"{LABELS[k]} {pass_name} {crossover_text(part(rows, series, pass_name), k, 'cudnn_softmax')}"
        for k in LINEAR_KERNELS for pass_name in PASSES if (series, pass_name) in groups(rows))
    lines += ["",
              f"- Crossover against cuDNN: the specification said {SPEC_CROSSOVER}. Measured ({series}): "
              f"{crossovers or 'not measured'}.",
              f"- The specification's own naive FlashAttention at 128k: {SPEC_NAIVE_FA_128K_TOKENS_PER_S} tok/s "
              f"({SPEC_NAIVE_SPEEDUP_128K} slower than its linear attention); cuflash's softmax (cuda) measured "
              f"{cuflash_softmax_128k} tok/s there.", ""]
    return lines


def report_markdown(doc, json_name="linear.json", plot_name="linear.png") -> str:
    header, rows = doc["header"], doc["rows"]
    lines = ["# Linear attention against softmax attention: measured", "",
             f"{header['device']}, {header['date']}, commit {header['commit']}. Data: [{json_name}]({json_name}), "
             "the json of one run of `bench/linear_vs_softmax.py`; this page is written from it by "
             "`python3 bench/linear_vs_softmax.py --report <json> --out <this folder>`.", ""]
    lines += partial_note(header)
    lines += ["## How it was measured", "",
              "- One process on one GPU, every kernel in the same run, point after point "
              "(`bench/linear_vs_softmax.py`). Each time is the median of CUDA-event times from "
              f"`triton.testing.do_bench` after its warm-up ({header.get('warmup_ms', '?')} ms warm-up, "
              f"{header.get('rep_ms', '?')} ms of repetitions, L2 flushed before each call); first calls (Triton "
              "compiles, cuDNN graph builds) fall before the timed ones.",
              f"- Kernels: cuflash.linear_attention (backend cuda) and fla's chunk_linear_attn with the same "
              "function (identity φ, normalize=False, scale 1/√D, causal); cuflash.attention (backend cuda) and "
              "torch SDPA on its cuDNN backend (causal), all on the same [B, S, H, D] tensors (SDPA on their "
              "transposed views). Forward: one call under no_grad; forward + backward: a forward and a backward "
              "from a random dout, gradients reset before each call (written, not accumulated).",
              f"- {conditions(header)}",
              f"- Series: {SERIES_TEXT['tokens16k']}; {SERIES_TEXT['b1']}. A CUDA out-of-memory error is "
              "recorded for its kernel and point (\"OOM\") and the run goes on.", "",
              "## Plot", "",
              f"![time against sequence length, log-log]({plot_name})", "",
              f"Drawn from the json by `python3 bench/plot_linear.py {json_name} {plot_name}`.", ""]
    lines += prefill_tables(rows) + crossover_table(rows) + decode_table(rows) + spec_section(rows) + failures(rows)
    return "\n".join(lines) + "\n"


def write_report(json_path, out_dir) -> list[str]:
    """linear.md, linear.json and (with matplotlib) linear.png in out_dir; returns what it did, line by line."""
    with open(json_path) as f:
        doc = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    json_copy = os.path.join(out_dir, "linear.json")
    done = []
    if not os.path.exists(json_copy) or not os.path.samefile(json_path, json_copy):
        shutil.copyfile(json_path, json_copy)
        done.append(f"wrote {json_copy}")
    with open(os.path.join(out_dir, "linear.md"), "w") as f:
        f.write(report_markdown(doc))
    done.append(f"wrote {os.path.join(out_dir, 'linear.md')}")
    done.append(plot(doc["header"], doc["rows"], os.path.join(out_dir, "linear.png")))
    return done


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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare outputs on small shapes instead of timing")
    parser.add_argument("--report", metavar="JSON",
                        help="write linear.md (+ linear.json, linear.png) into --out from a run's json; no GPU")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".")
    parser.add_argument("--series", nargs="+", choices=SERIES, default=list(SERIES))
    parser.add_argument("--lengths", type=int, nargs="+", default=LENGTHS)
    parser.add_argument("--linear-only-lengths", type=int, nargs="*", default=LINEAR_ONLY_LENGTHS,
                        help="lengths where only the linear kernels run (softmax: skipped, quadratic)")
    parser.add_argument("--softmax-max-len", type=int, default=SOFTMAX_MAX_LEN,
                        help="softmax kernels are skipped above this length")
    parser.add_argument("--decode-contexts", type=int, nargs="*", default=DECODE_CONTEXTS)
    parser.add_argument("--decode-batches", "--decode-batch", type=int, nargs="*", default=DECODE_BATCHES)
    parser.add_argument("--kernels", nargs="+", choices=DECODE_KERNELS, default=list(DECODE_KERNELS))
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--warmup-ms", type=int, default=25)
    parser.add_argument("--rep-ms", type=int, default=100)
    parser.add_argument("--plot", action="store_true", help="also draw linear_vs_softmax.png (needs matplotlib)")
    args = parser.parse_args(argv)
    if args.report:
        for line in write_report(args.report, args.out):
            print(line)
        return 0
    return check(args) if args.check else benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
