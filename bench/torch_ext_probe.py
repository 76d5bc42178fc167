"""Host time per call from Python: cuflash's torch operators in C++ (``_ext_torch.so``) against
the Python path (``CUFLASH_TORCH_EXT=0``: the module called directly, a Python autograd.Function)
and torch SDPA, for forward, forward with ``requires_grad``, forward + ``.backward()``, the same
through ``torch.compile``, varlen forward + backward and a paged KV-cache decode step.

Each path runs in its own interpreter (the choice is made once per process, at import). Host
time is a loop of calls without synchronization, wall time / calls, after a warm-up (what a
training or decode loop pays on the CPU side; docs/perf/NOTES.md "Python path, first round"
measured the Python path this way). On the GPU machine:

    python bench/torch_ext_probe.py                       # cuda, bf16, B1 H16 S128 D64 causal
    python bench/torch_ext_probe.py --seqlen 512 --head-dim 128 --json /tmp/probe.json

Without a GPU it runs on CPU tensors (float32, a small shape), where the numbers include the
CPU backend's compute and only say that both paths run.
"""

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("fwd", "fwd_requires_grad", "fwd_bwd", "compiled_fwd_bwd", "varlen_fwd_bwd", "kvcache_decode")


def host_us(fn, calls, sync):
    for _ in range(max(10, calls // 20)):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    sync()
    return round(elapsed / calls * 1e6, 2)


def child(args):
    import torch
    import torch.nn.functional as F

    import cuflash
    from cuflash import _torch_ext

    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(0)
    b, h, s, d = args.batch, args.heads, args.seqlen, args.head_dim

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=args.device, dtype=dtype)

    q, k, v = randn(b, s, h, d), randn(b, s, h, d), randn(b, s, h, d)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    dout = randn(b, s, h, d)
    backend = args.backend or ("cuda" if cuda else "cpu")
    results = {"path": "ext" if _torch_ext.LOADED else "python", "reason": _torch_ext.REASON}

    def attend(q, k, v):
        return cuflash.attention(q, k, v, causal=True, backend=backend)

    def fwd_bwd():
        attend(qg, kg, vg).backward(dout)

    compiled = torch.compile(attend, fullgraph=True)

    def compiled_fwd_bwd():
        compiled(qg, kg, vg).backward(dout)

    lengths = torch.full((b,), s, dtype=torch.int32)
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)]).to(args.device)
    packed = [x.detach().reshape(b * s, h, d).clone().requires_grad_() for x in (q, k, v)]
    dpacked = dout.reshape(b * s, h, d)

    def varlen_fwd_bwd():
        cuflash.flash_attn_varlen_func(*packed, cu, cu, s, s, causal=True).backward(dpacked)

    page, pages = 16, (args.kv_len + 15) // 16
    k_cache, v_cache = randn(b * pages, page, h, d), randn(b * pages, page, h, d)
    table = torch.arange(b * pages, dtype=torch.int32, device=args.device).view(b, pages)
    seqlens = torch.full((b,), args.kv_len, dtype=torch.int32, device=args.device)
    q1 = randn(b, 1, h, d)
    cuflash.set_index_checks(False)  # a hot decode loop's setting

    def decode():
        cuflash.flash_attn_with_kvcache(q1, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True)

    cases = {
        "fwd": lambda: attend(q, k, v),
        "fwd_requires_grad": lambda: attend(qg, kg, vg),
        "fwd_bwd": fwd_bwd,
        "compiled_fwd_bwd": compiled_fwd_bwd,
        "varlen_fwd_bwd": varlen_fwd_bwd,
        "kvcache_decode": decode,
    }
    for name, fn in cases.items():
        try:
            results[name] = host_us(fn, args.calls, sync)
        except Exception as error:  # a case that cannot run says why
            results[name] = f"{type(error).__name__}: {str(error)[:160]}"
    if args.sdpa:
        qt, kt, vt = (x.transpose(1, 2) for x in (qg, kg, vg))
        dt = dout.transpose(1, 2)
        results["sdpa_fwd"] = host_us(lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True), args.calls, sync)
        results["sdpa_fwd_bwd"] = host_us(
            lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).backward(dt), args.calls, sync)
    print("RESULT " + json.dumps(results))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--backend", default=None, help="cuflash backend (default: cuda on a GPU, cpu otherwise)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--seqlen", type=int, default=None)
    parser.add_argument("--head-dim", type=int, default=None)
    parser.add_argument("--kv-len", type=int, default=None, help="cached keys per sequence of the decode case")
    parser.add_argument("--calls", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sdpa", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device == "cuda"
    defaults = dict(heads=16 if gpu else 4, seqlen=128 if gpu else 16, head_dim=64 if gpu else 32,
                    kv_len=4096 if gpu else 64, calls=2000 if gpu else 200)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.child:
        child(args)
        return
    rows = {}
    for label, setting in (("ext", "1"), ("python", "0")):
        command = [sys.executable, os.path.abspath(__file__), "--child", "--device", args.device, "--batch",
                   str(args.batch), "--heads", str(args.heads), "--seqlen", str(args.seqlen), "--head-dim",
                   str(args.head_dim), "--kv-len", str(args.kv_len), "--calls", str(args.calls)]
        if args.backend:
            command += ["--backend", args.backend]
        if label == "ext":
            command.append("--sdpa")
        run = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, CUFLASH_TORCH_EXT=setting))
        lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode != 0 or not lines:
            rows[label] = {"error": (run.stderr or run.stdout)[-600:]}
        else:
            rows[label] = json.loads(lines[-1][len("RESULT "):])
    print(f"host us per call, {args.device}, B{args.batch} H{args.heads} S{args.seqlen} D{args.head_dim} causal "
          f"(decode: kv {args.kv_len}, 16-key pages), {args.calls} calls")
    print(f"{'case':<22}{'C++ operators':>16}{'Python path':>16}")
    for case in CASES:
        cells = [rows[label].get(case, rows[label].get("error", "-")) for label in ("ext", "python")]
        print(f"{case:<22}" + "".join(f"{c:>16}" if not isinstance(c, str) else f"  {c[:60]}" for c in cells))
    for case in ("sdpa_fwd", "sdpa_fwd_bwd"):
        if case in rows["ext"]:
            print(f"{'torch ' + case:<22}{rows['ext'][case]:>16}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"args": vars(args), "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
