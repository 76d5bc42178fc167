#!/usr/bin/env python3
"""FlashAttention-4 (flash_attn.cute) against PyTorch's math SDPA in float32,
on the GPU, before bench/prefill.py times it as the `fa4` peer: bf16 inputs of
[B, S, H, D] at the sweep's head dims (64, 128, 256), causal and not, a
sequence length that is not a multiple of any tile (so the masked tails run),
the forward output and the three gradients. A peer is timed only if it
computes attention; exit 1 otherwise. Prints one line per case and the
package versions.

    python3 bench/fa4_check.py [--head-dims 64,128,256] [--tolerance 0.02]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time


def rel_l2(x, ref) -> float:
    return float((x.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", default="64,128,256")
    parser.add_argument("--tolerance", type=float, default=0.02, help="largest relative L2 error accepted")
    args = parser.parse_args(argv)
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from flash_attn.cute import flash_attn_func

    versions = {name: importlib.metadata.version(name) for name in ("flash-attn-4", "nvidia-cutlass-dsl")}
    print(f"fa4_check: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          + ", ".join(f"{k} {v}" for k, v in versions.items()))
    generator = torch.Generator(device="cuda").manual_seed(0)
    batch, seqlen, heads = 2, 333, 4
    failed = 0
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for causal in (False, True):
            def make():
                return torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                                   generator=generator).requires_grad_()
            q, k, v = make(), make(), make()
            dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                               generator=generator)
            start = time.perf_counter()
            result = flash_attn_func(q, k, v, causal=causal)
            out = result[0] if isinstance(result, tuple) else result
            out.backward(dout)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - start  # the first call: mostly compilation
            got = [out.detach(), q.grad, k.grad, v.grad]
            q32, k32, v32 = (x.detach().float().transpose(1, 2).requires_grad_() for x in (q, k, v))
            with sdpa_kernel(SDPBackend.MATH):
                ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal)
            ref.backward(dout.float().transpose(1, 2))
            want = [ref.detach().transpose(1, 2), q32.grad.transpose(1, 2), k32.grad.transpose(1, 2),
                    v32.grad.transpose(1, 2)]
            errors = [rel_l2(g, w) for g, w in zip(got, want)]
            ok = all(e <= args.tolerance for e in errors)  # (a NaN compares false: not ok)
            failed += not ok
            print(f"fa4_check: D={head_dim:<3} {'causal' if causal else 'none  '} rel_l2 out/dq/dk/dv "
                  + " ".join(f"{e:.2e}" for e in errors) + f"  first call {seconds:.1f} s  {'ok' if ok else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
