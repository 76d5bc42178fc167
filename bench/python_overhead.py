"""What a call costs from Python: cuflash eager and compiled, the same problem in C++, torch SDPA.

Run on the GPU machine (torch, triton and the cuflash package importable,
``cuflash`` the C++ command):

    python bench/python_overhead.py --cuflash-cli build/bin/cuflash --out docs/perf/python-overhead

For every point (bf16, causal) and pass (fwd; fwdbwd = forward then
backward through autograd), each method gets two numbers:

- ``us``: device time per call, ``triton.testing.do_bench`` median (it
  flushes L2 with a memset before each timed call, so a host path shorter
  than that memset is hidden, one longer shows);
- ``host_us``: host time per call, a loop of calls without synchronization
  (wall time / calls) after warm-up: what a training or decode loop pays on
  the CPU side.

Methods: ``cuflash_python`` (``cuflash.attention`` / ``flash_attn_with_kvcache``
eager), ``cuflash_compiled`` (the same inside ``torch.compile``),
``cuflash_cpp`` (``cuflash bench --json``: CUDA-event median and its host time,
same backend, same shapes), ``torch_flash`` and ``torch_cudnn`` (SDPA with one
backend forced, on BHSD views of the same tensors). Decode points (one query
per sequence, paged cache of 16-key pages, kv 4096, 32/8 heads, D=128) time
the forward only, with index checks off in both cuflash paths (a hot decode
loop; the C++ bench's timed calls skip them too); SDPA runs them on a
contiguous cache (GQA through enable_gqa).
"""

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import cuflash
from bench_common import write_report

PREFILL = [  # (name, batch, heads, seqlen, head_dim)
    ("B1 H16 S128 D64", 1, 16, 128, 64),
    ("B1 H16 S128 D128", 1, 16, 128, 128),
    ("B1 H16 S512 D64", 1, 16, 512, 64),
    ("B1 H16 S512 D128", 1, 16, 512, 128),
    ("B8 H16 S128 D128", 8, 16, 128, 128),
    ("B4 H16 S4096 D128", 4, 16, 4096, 128),
]
DECODE_BATCHES = (1, 8, 64)
DECODE = dict(kv_len=4096, heads_q=32, heads_kv=8, head_dim=128, page_size=16)
METHODS = ("cuflash_python", "cuflash_compiled", "cuflash_cpp", "torch_flash", "torch_cudnn")


def host_time(fn, calls):
    """Host microseconds per call of a loop without synchronization (after a warm-up)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def measure(fn, calls):
    try:
        fn()
        torch.cuda.synchronize()
        us = do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3
        return {"us": round(us, 2), "host_us": round(host_time(fn, calls), 2)}
    except Exception as error:  # a peer that cannot run a point says why, in the row
        return {"us": None, "host_us": None, "error": f"{type(error).__name__}: {str(error)[:200]}"}


def sdpa(backend, q, k, v, causal, gqa=False):
    def call():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    return call


def with_backward(forward, inputs, grad):
    def call():
        forward().backward(grad)
        for x in inputs:
            x.grad = None
    return call


def prefill_rows(args, cli_rows):
    rows = []
    for name, batch, heads, seqlen, dim in PREFILL:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(batch, seqlen, heads, dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for _ in range(3))
        grad = torch.randn_like(q)
        calls = 200 if seqlen <= 512 else 20

        def attend(q, k, v):
            return cuflash.attention(q, k, v, causal=True, backend=args.backend)

        compiled = torch.compile(attend, fullgraph=True)
        for pass_name in ("fwd", "fwdbwd"):
            backward = pass_name == "fwdbwd"
            qg, kg, vg = (x.detach().clone().requires_grad_(backward) for x in (q, k, v))
            bhsd = [x.transpose(1, 2) for x in (qg, kg, vg)]
            grad_bhsd = grad.transpose(1, 2)
            methods = {
                "cuflash_python": lambda: attend(qg, kg, vg),
                "cuflash_compiled": lambda: compiled(qg, kg, vg),
                "torch_flash": sdpa(SDPBackend.FLASH_ATTENTION, *bhsd, True),
                "torch_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION, *bhsd, True),
            }
            row = {"point": name, "pass": pass_name, "batch": batch, "heads": heads, "seqlen": seqlen,
                   "head_dim": dim, "backend": args.backend}
            for method, forward in methods.items():
                g = grad_bhsd if method.startswith("torch") else grad
                fn = with_backward(forward, (qg, kg, vg), g) if backward else forward
                row[method] = measure(fn, calls)
            row["cuflash_cpp"] = cli_rows.get(("prefill", pass_name, batch, heads, seqlen, dim),
                                              {"us": None, "host_us": None, "error": "not measured"})
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def decode_rows(args, cli_rows):
    rows = []
    d = DECODE
    cuflash.set_index_checks(False)
    for batch in DECODE_BATCHES:
        gen = torch.Generator(device="cuda").manual_seed(1)
        pages_per_seq = d["kv_len"] // d["page_size"]
        num_pages = batch * pages_per_seq
        shape = (num_pages, d["page_size"], d["heads_kv"], d["head_dim"])
        k_cache, v_cache = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
        block_table = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32).view(batch, -1)
        seqlens = torch.full((batch,), d["kv_len"], device="cuda", dtype=torch.int32)
        q = torch.randn(batch, 1, d["heads_q"], d["head_dim"], device="cuda", dtype=torch.bfloat16, generator=gen)

        def step(q, k_cache, v_cache, seqlens, block_table):
            return cuflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens,
                                                   block_table=block_table, causal=True)

        compiled = torch.compile(step, fullgraph=True)
        # SDPA peers: the same keys on a contiguous cache [B, Hk, kv, D].
        k_dense, v_dense = (c[block_table.long()].reshape(batch, d["kv_len"], d["heads_kv"], d["head_dim"])
                            .transpose(1, 2).contiguous() for c in (k_cache, v_cache))
        q_bhsd = q.transpose(1, 2)
        row = {"point": f"decode B{batch} kv{d['kv_len']} paged{d['page_size']} 32/8 D128", "pass": "fwd",
               "batch": batch, "backend": args.backend}
        row["cuflash_python"] = measure(lambda: step(q, k_cache, v_cache, seqlens, block_table), 200)
        row["cuflash_compiled"] = measure(lambda: compiled(q, k_cache, v_cache, seqlens, block_table), 200)
        row["torch_flash"] = measure(sdpa(SDPBackend.FLASH_ATTENTION, q_bhsd, k_dense, v_dense, False, True), 200)
        row["torch_cudnn"] = measure(sdpa(SDPBackend.CUDNN_ATTENTION, q_bhsd, k_dense, v_dense, False, True), 200)
        row["cuflash_cpp"] = cli_rows.get(("decode", batch), {"us": None, "host_us": None, "error": "not measured"})
        rows.append(row)
        print(json.dumps(row), flush=True)
    cuflash.set_index_checks(True)
    return rows


def run_cli(args):
    """The C++ numbers, from `cuflash bench --json` (CUDA-event medians and host time per call)."""
    rows = {}
    if not args.cuflash_cli:
        return rows
    backend = args.backend
    common = [args.cuflash_cli, "bench", "--json", "--backend", backend, "--dtype", "bf16"]
    for _, batch, heads, seqlen, dim in PREFILL:
        out = subprocess.run(common + ["--causal", "--pass", "fwd,fwdbwd", "--batch", str(batch), "--heads",
                                       str(heads), "--seqlen", str(seqlen), "--head-dim", str(dim)],
                             capture_output=True, text=True)
        for line in out.stdout.splitlines():
            r = json.loads(line)
            key = ("prefill", r["pass"], r["batch"], r["heads"], r["seqlen"], r["head_dim"])
            rows[key] = _cli_timing(r)
        if out.returncode != 0:
            print(f"cuflash bench: {out.stderr.strip()[:300]}", file=sys.stderr)
    d = DECODE
    out = subprocess.run(common + ["--mode", "decode", "--batches", ",".join(map(str, DECODE_BATCHES)), "--kv-len",
                                   str(d["kv_len"]), "--gqa", f"{d['heads_q']}/{d['heads_kv']}", "--page-size",
                                   str(d["page_size"]), "--head-dim", str(d["head_dim"])],
                         capture_output=True, text=True)
    for line in out.stdout.splitlines():
        r = json.loads(line)
        rows[("decode", r["batch"])] = _cli_timing(r)
    if out.returncode != 0:
        print(f"cuflash bench decode: {out.stderr.strip()[:300]}", file=sys.stderr)
    return rows


def _cli_timing(r):
    if r.get("error"):
        return {"us": None, "host_us": None, "error": r["error"]}
    return {"us": round(r["median_ms"] * 1e3, 2), "host_us": round(r["host_us"], 2)}


def markdown(meta, rows):
    lines = [f"# cuflash from Python: time per call ({meta['device']}, {meta['date']}, commit {meta['commit']})", "",
             f"torch {meta['torch']}, cuflash backend `{meta['backend']}`, bf16, causal. `us`: device time per call "
             "(triton do_bench median, L2 flushed); `host`: host time per call in a loop without synchronization. "
             "Generated by bench/python_overhead.py; the json beside this file has every number.", "",
             "| point | pass | " + " | ".join(f"{m} us / host" for m in METHODS)
              + " | python ≤ 1.1×cpp+3 | host ≤ SDPA |",
             "| --- | --- | " + " | ".join("---:" for _ in METHODS) + " | --- | --- |"]
    for r in rows:
        cells = []
        for m in METHODS:
            t = r[m]
            cells.append("n/a" if t.get("us") is None else f"{t['us']:.1f} / {t['host_us']:.1f}")
        py, cpp = r["cuflash_python"], r["cuflash_cpp"]
        time_ok = "n/a" if py.get("us") is None or cpp.get("us") is None else (
            "yes" if py["us"] <= 1.1 * cpp["us"] + 3 else "NO")
        peers = [r[m]["host_us"] for m in ("torch_flash", "torch_cudnn") if r[m].get("host_us") is not None]
        host_ok = "n/a" if py.get("host_us") is None or not peers else (
            "yes" if py["host_us"] <= min(peers) else "NO")
        lines.append(f"| {r['point']} | {r['pass']} | " + " | ".join(cells) + f" | {time_ok} | {host_ok} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", help="cuflash backend for the Python and C++ rows")
    parser.add_argument("--cuflash-cli", default="build/bin/cuflash", help="the cuflash command ('' to skip)")
    parser.add_argument("--out", default="docs/perf/python-overhead", help="writes OUT.json and OUT.md")
    parser.add_argument("--commit", default=os.environ.get("CUFLASH_COMMIT", "unknown"))
    parser.add_argument("--skip-decode", action="store_true")
    args = parser.parse_args()
    meta = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "commit": args.commit,
            "torch": torch.__version__, "backend": args.backend,
            "cudnn_in_package": cuflash.backend_available("cudnn")}
    cli_rows = run_cli(args)
    rows = prefill_rows(args, cli_rows)
    if not args.skip_decode:
        rows += decode_rows(args, cli_rows)
    write_report(args.out, meta, rows, markdown)


if __name__ == "__main__":
    main()
