#!/usr/bin/env python3
"""Writes src/cuda/sm90/wgmma.cuh: the wgmma.mma_async wrappers the Hopper kernels
use, one explicit specialization per (element type, N, form), whose inline-PTX
operand lists (N / 2 fp32 accumulators per thread) are too long to write by hand.

    python3 scripts/gen_wgmma.py            # rewrite the header
    python3 scripts/gen_wgmma.py --check    # exit 1 if the header differs (CI)

N: every N a kernel instantiates. S = Q K^T takes N = the key tile (64 ... 256);
O += P V takes N = the head-dim columns the kernel computes (its kernel head dim,
or fewer for a narrower caller's head dim: 80, 96 on the 128 kernel, 48 on the 64
one). wgmma allows any multiple of 8 up to 256.
"""
import argparse
import pathlib
import sys

HEADER = pathlib.Path(__file__).resolve().parent.parent / "src/cuda/sm90/wgmma.cuh"

# (N values, in the order the header lists them)
N_VALUES = [64, 192, 128, 256, 48, 80, 96]
# N values of the shared-memory form only: the wide backward's S = Q K^T and
# dP = dO V^T over one consumer's 32 keys.
SS_ONLY_N_VALUES = [32]
# N values of the shared-memory form with B MN-major (the backward's dQ = dS K,
# K stored with the keys as rows: N = the head-dim columns one consumer computes).
SS_TRANS_B_N_VALUES = [64, 32, 128]
# N values of the shared-memory form with A and B MN-major (the wide backward's
# dV += P^T dO and dK += dS^T Q, P and dS stored [queries][keys]: N = the
# head-dim columns one consumer computes).
SS_TRANS_AB_N_VALUES = [128]
TYPES = [("__nv_bfloat16", "bf16"), ("__half", "f16")]

PREAMBLE = '// The sm90a warpgroup instructions the Hopper forward is built from, one\n// inline-PTX wrapper each: shared-memory matrix descriptors (128-byte\n// swizzle), wgmma.fence / commit_group / wait_group, and\n// wgmma.mma_async m64nNk16 with fp32 accumulators, for A from shared memory\n// ("ss") or from registers ("rs"), bf16 and fp16.\n//\n// Accumulator layout (per warp w of the warpgroup, g = lane / 4, t = lane % 4):\n// d[i][0..1] = row 16w + g, columns 8i + 2t, 8i + 2t + 1; d[i][2..3] = row\n// 16w + g + 8, same columns: per warp, exactly the layout of N/8 mma.sync\n// m16n8 accumulators. The register A operand of m64k16 is the mma.sync\n// m16n8k16 A fragment of the warp\'s 16 rows, so P goes from the S\n// accumulators to P V as on sm80.\n//\n// The asm operand lists are long but mechanical: this file is written by\n// scripts/gen_wgmma.py (edit that and run it, not this file).\n#pragma once\n\n#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n\n#include <cstdint>\n\n#include "common/tensor_core.cuh"\n\nnamespace cuflash::detail::sm90 {\n\nusing sm80::smem_address;\n\n// Descriptor of a shared-memory operand laid out in 128-byte-swizzle atoms\n// (8 rows of 128 bytes, 16-byte chunk c of row r stored at chunk c ^ (r % 8),\n// atoms 1024-byte aligned). Byte offsets are encoded in 16-byte units.\n//   K-major operand: rows are M (or N) and hold 64 consecutive K elements;\n//     sbo = bytes from one 8-row group to the next; lbo is unused.\n//   MN-major operand: rows are K and hold 64 consecutive M (or N) elements;\n//     lbo = bytes from one 64-element M/N block to the next, sbo = bytes from\n//     one group of 8 K rows to the next.\n__device__ __forceinline__ std::uint64_t sw128_desc(const void* smem, std::uint32_t lbo_bytes,\n                                                    std::uint32_t sbo_bytes) {\n  const std::uint64_t start = (smem_address(smem) & 0x3FFFFu) >> 4;\n  return start | (static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFFu) << 16) |\n         (static_cast<std::uint64_t>((sbo_bytes >> 4) & 0x3FFFu) << 32) | (1ull << 62);\n}\n// The same descriptor moved by `bytes` (a multiple of 16) in shared memory.\n__device__ __forceinline__ std::uint64_t desc_advance(std::uint64_t desc, std::uint32_t bytes) {\n  return desc + (bytes >> 4);\n}\n\n// Orders this thread\'s register and shared-memory writes before the\n// warpgroup\'s following wgmma.mma_async reads them.\n__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory"); }\n__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory"); }\n// Waits until at most `Pending` committed wgmma groups are still in flight.\ntemplate <int Pending>\n__device__ __forceinline__ void wgmma_wait() {\n  asm volatile("wgmma.wait_group.sync.aligned %0;\\n" ::"n"(Pending) : "memory");\n}\n// Generic-proxy writes to shared memory (cp.async, st.shared) visible to the\n// async proxy that wgmma reads through.\n__device__ __forceinline__ void fence_proxy_async_shared() {\n  asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");\n}\n// After a wgmma_wait: the accumulators are read only from here on (without\n// this the compiler may move a read of them above the wait).\ntemplate <int N8>\n__device__ __forceinline__ void fence_accumulators(float (&d)[N8][4]) {\n#pragma unroll\n  for (int i = 0; i < N8; ++i)\n#pragma unroll\n    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");\n}\n\n// d (+)= A B, A and B from shared memory, both K-major. accumulate = false\n// overwrites d.\ntemplate <typename T, int N>\n__device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], std::uint64_t desc_a, std::uint64_t desc_b,\n                                         bool accumulate);\n// d (+)= A B, A and B from shared memory, A K-major, B MN-major (rows are K).\ntemplate <typename T, int N>\n__device__ __forceinline__ void wgmma_ss_trans_b(float (&d)[N / 8][4], std::uint64_t desc_a, std::uint64_t desc_b,\n                                                 bool accumulate);\n// d (+)= A B, A and B from shared memory, both MN-major (A\'s rows are K).\ntemplate <typename T, int N>\n__device__ __forceinline__ void wgmma_ss_trans_ab(float (&d)[N / 8][4], std::uint64_t desc_a, std::uint64_t desc_b,\n                                                  bool accumulate);\n// d (+)= A B, A from registers (the warp\'s m16k16 fragment), B from shared\n// memory; TransB: B is MN-major (rows are K).\ntemplate <typename T, int N, bool TransB>\n__device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const std::uint32_t (&a)[4], std::uint64_t desc_b,\n                                         bool accumulate);\n\n'

EPILOGUE = "}  // namespace cuflash::detail::sm90\n"


def accumulators(n):
    return ", ".join(f'"+f"(d[{i}][{e}])' for i in range(n // 8) for e in range(4))


def registers(count, first=0):
    return ",".join(f"%{first + i}" for i in range(count))


def ss(ctype, ptx, n, trans_b=False, trans_a=False):
    regs = n // 2
    name = "wgmma_ss_trans_ab" if trans_a else "wgmma_ss_trans_b" if trans_b else "wgmma_ss"
    return (f"template <>\n"
            f"__device__ __forceinline__ void {name}<{ctype}, {n}>(float (&d)[{n // 8}][4], std::uint64_t desc_a, "
            f"std::uint64_t desc_b,\n"
            f"                                               bool accumulate) {{\n"
            f"  asm volatile(\n"
            f'      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 2}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{registers(regs)}}}, %{regs}, '
            f'%{regs + 1}, p, 1, 1, {1 if trans_a else 0}, {1 if trans_b else 0};\\n}}\\n"\n'
            f"      : {accumulators(n)}\n"
            f'      : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate)));\n'
            f"}}\n\n")


def rs(ctype, ptx, n, trans_b):
    regs = n // 2
    return (f"template <>\n"
            f"__device__ __forceinline__ void wgmma_rs<{ctype}, {n}, {'true' if trans_b else 'false'}>"
            f"(float (&d)[{n // 8}][4], const std::uint32_t (&a)[4],\n"
            f"                                                      std::uint64_t desc_b, bool accumulate) {{\n"
            f"  asm volatile(\n"
            f'      "{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{regs + 5}, 0;\\n"\n'
            f'      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{registers(regs)}}}, '
            f'{{{registers(4, regs)}}}, %{regs + 4}, p, 1, 1, {1 if trans_b else 0};\\n}}\\n"\n'
            f"      : {accumulators(n)}\n"
            f'      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate)));\n'
            f"}}\n\n")


def header():
    out = [PREAMBLE]
    for n in N_VALUES:
        for ctype, ptx in TYPES:
            out.append(ss(ctype, ptx, n))
            out.append(rs(ctype, ptx, n, False))
            out.append(rs(ctype, ptx, n, True))
    for n in SS_ONLY_N_VALUES:
        for ctype, ptx in TYPES:
            out.append(ss(ctype, ptx, n))
    for n in SS_TRANS_B_N_VALUES:
        for ctype, ptx in TYPES:
            out.append(ss(ctype, ptx, n, trans_b=True))
    for n in SS_TRANS_AB_N_VALUES:
        for ctype, ptx in TYPES:
            out.append(ss(ctype, ptx, n, trans_b=True, trans_a=True))
    out.append(EPILOGUE)
    return "".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    text = header()
    if args.check:
        if HEADER.read_text() != text:
            sys.exit(f"{HEADER} is not what scripts/gen_wgmma.py writes: run it")
        return
    HEADER.write_text(text)


if __name__ == "__main__":
    main()
