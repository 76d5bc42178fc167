#!/usr/bin/env python3
"""The kernels a peer launches for one forward+backward on the papers' shape
(16k tokens, hidden 2048), from the torch profiler's trace: name, time, grid,
block, registers and shared memory of each, for PyTorch SDPA's cuDNN backend
and FlashAttention-4 (when bench/fa4-receive.sh installed it and its env is
sourced; otherwise that line says it failed). On the GPU machine:

    python3 bench/peer_kernels.py <head_dim> <seqlen> <causal 0|1>
"""
import json, os, sys, tempfile, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
d, s, causal = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
h, b = 2048 // d, 16384 // s
q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_() for _ in range(3))
def run(which):
    if which == "fa4":
        from flash_attn.cute import flash_attn_func
        o = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
        o = o[0] if isinstance(o, tuple) else o
    else:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(torch.randn_like(o))
for which in ("cudnn", "fa4"):
    try:
        for _ in range(3): run(which)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            run(which); torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "trace.json")
            prof.export_chrome_trace(path)
            events = json.load(open(path))["traceEvents"]
        for e in events:
            if e.get("cat") == "kernel":
                a = e.get("args", {})
                print(f"{which} d{d} s{s} c{int(causal)} {e['dur']:8.1f}us grid {a.get('grid')} "
                      f"block {a.get('block')} regs {a.get('registers per thread')} "
                      f"smem {a.get('shared memory')} {e['name'][:150]}")
    except Exception as ex:
        print(which, "failed", ex)
