#!/usr/bin/env python3
"""The table of tensor-core kernel instantiations: (kernel, element type, head dim).
Writes from it the explicit instantiations (src/cuda/inst/*.cu, one per entry, so
the build compiles them in parallel) and src/cuda/common/kernel_table.hpp (the
same lists for the host, and the switches that turn a runtime head dim into the
template arguments of an instantiated kernel). The tile headers check their
kernels against these lists at compile time (sm90/flash_fwd_wgmma_tiles.hpp).

    python3 scripts/gen_kernel_table.py            # rewrite the files
    python3 scripts/gen_kernel_table.py --check    # exit 1 if any differs (CI)

To add a head dim or a narrower TMA instantiation: add it below, add its tile
(sm80/flash_fwd_tiles.hpp, sm90/flash_fwd_wgmma_tiles.hpp), run this, and, for
a new wgmma N, scripts/gen_wgmma.py.
"""
import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INST = ROOT / "src/cuda/inst"
HEADER = ROOT / "src/cuda/common/kernel_table.hpp"

DTYPES = [("bf16", "__nv_bfloat16"), ("fp16", "__half")]
# sm80 mma.sync forward, backward and decode (every GPU from sm_80, Hopper too).
SM80_HEAD_DIMS = [32, 64, 96, 128, 192, 256]
# The cp.async wgmma forward (sm_90a): whole 64-element swizzle atoms.
WGMMA_HEAD_DIMS = [64, 128, 192, 256]
# The warp-specialized TMA forward (sm_90a): (kernel head dim, columns computed),
# the columns below the kernel dim for narrower callers' head dims.
TMA_INSTANCES = [(64, 64), (64, 48), (128, 128), (128, 80), (128, 96), (192, 192), (256, 256)]
# The warp-specialized TMA backward (sm_90a): the caller's head dim is the kernel's.
TMA_BWD_HEAD_DIMS = [64, 128, 256]

NAMESPACE_END = "}}  // namespace cuflash::detail::{ns}\n"


def inst_file(header, ns, declaration, comment):
    return (f"{comment}\n#include \"{header}\"\n\nnamespace cuflash::detail::{ns} {{\n{declaration}\n"
            + NAMESPACE_END.format(ns=ns))


def inst_files():
    files = {}
    for tag, ctype in DTYPES:
        for d in SM80_HEAD_DIMS:
            files[f"flash_fwd_{tag}_d{d}.cu"] = inst_file(
                "sm80/flash_fwd_launch.cuh", "sm80",
                f"template Status launch_flash_fwd<{ctype}, {d}>(const ForwardParams&, cudaStream_t);",
                "// One instantiation of the forward kernel; see sm80/flash_fwd_launch.cuh.")
            files[f"flash_bwd_{tag}_d{d}.cu"] = inst_file(
                "sm80/flash_bwd_launch.cuh", "sm80",
                f"template Status launch_flash_backward<{ctype}, {d}>(const BackwardParams&, int, cudaStream_t);",
                "// One instantiation of the backward kernels; see sm80/flash_bwd_launch.cuh.")
            files[f"flash_decode_{tag}_d{d}.cu"] = inst_file(
                "sm80/flash_decode_launch.cuh", "sm80",
                f"template Status launch_flash_decode<{ctype}, {d}>(const ForwardParams&, int, bool, cudaStream_t);",
                "// One instantiation of the decode kernel; see sm80/flash_decode_launch.cuh.")
        for d in WGMMA_HEAD_DIMS:
            files[f"flash_fwd_wgmma_{tag}_d{d}.cu"] = inst_file(
                "sm90/flash_fwd_wgmma_launch.cuh", "sm90",
                f"template Status launch_flash_fwd_wgmma<{ctype}, {d}>(const ForwardParams&, cudaStream_t);",
                "// One instantiation of the Hopper forward; see sm90/flash_fwd_wgmma_launch.cuh.")
        for d, columns in TMA_INSTANCES:
            declaration = (f"template Status launch_flash_fwd_tma<{ctype}, {d}, {columns}>(const ForwardParams&, "
                           "const TmaForwardLaunch&, cudaStream_t);")
            if columns == d:
                name = f"flash_fwd_tma_{tag}_d{d}.cu"
                comment = "// One instantiation of the TMA forward; see sm90/flash_fwd_tma_launch.cuh."
            else:
                name = f"flash_fwd_tma_{tag}_d{d}_c{columns}.cu"
                comment = (f"// One instantiation of the TMA forward (kernel head dim {d}, {columns} columns\n"
                           "// computed: sm90::tma_columns); see sm90/flash_fwd_tma_launch.cuh.")
            files[name] = inst_file("sm90/flash_fwd_tma_launch.cuh", "sm90", declaration, comment)
        for d in TMA_BWD_HEAD_DIMS:
            files[f"flash_bwd_tma_{tag}_d{d}.cu"] = inst_file(
                "sm90/flash_bwd_tma_launch.cuh", "sm90",
                f"template Status launch_flash_bwd_tma<{ctype}, {d}>(const BackwardParams&, const TmaBackwardLaunch&, "
                "void*, cudaStream_t);",
                "// One instantiation of the TMA backward; see sm90/flash_bwd_tma_launch.cuh.")
    return files


def int_list(values):
    return "{" + ", ".join(str(v) for v in values) + "}"


def header():
    sm80_cases = "".join(f"    case {d}: return f(std::integral_constant<int, {d}>{{}});\n" for d in SM80_HEAD_DIMS)
    tma_bwd_cases = "".join(f"    case {d}: return f(std::integral_constant<int, {d}>{{}});\n"
                            for d in TMA_BWD_HEAD_DIMS)
    tma_cases = "".join(
        f"    case {columns}: return f(std::integral_constant<int, {d}>{{}}, std::integral_constant<int, {columns}>{{}});\n"
        for d, columns in sorted(TMA_INSTANCES, key=lambda t: t[1]))
    columns = [c for _, c in TMA_INSTANCES]
    assert len(set(columns)) == len(columns), "one TMA instantiation per column count"
    tma_pairs = ", ".join(f"{{{d}, {c}}}" for d, c in TMA_INSTANCES)
    return f"""// The tensor-core kernels' instantiations, (kernel, element type, head dim),
// for the host: which head dims each kernel has, and the switches from a
// runtime head dim to an instantiated kernel's template arguments. Written by
// scripts/gen_kernel_table.py with the instantiation files in src/cuda/inst/
// (edit the table there and run it, not this file); every element type
// (bf16, fp16) has every entry.
#pragma once

#include <type_traits>

namespace cuflash::detail::kernel_table {{

// sm80 forward, backward and decode kernel head dims, ascending.
inline constexpr int kSm80HeadDims[] = {int_list(SM80_HEAD_DIMS)};
// The cp.async wgmma forward's head dims.
inline constexpr int kWgmmaHeadDims[] = {int_list(WGMMA_HEAD_DIMS)};

// The TMA forward: (kernel head dim, columns computed); columns below the
// kernel dim serve narrower callers' head dims.
struct TmaInstance {{
  int head_dim, columns;
}};
inline constexpr TmaInstance kTmaInstances[] = {{{tma_pairs}}};
// The TMA backward's head dims (the caller's must be one of them).
inline constexpr int kTmaBackwardHeadDims[] = {int_list(TMA_BWD_HEAD_DIMS)};

template <int N>
constexpr bool contains(const int (&list)[N], int value) {{
  for (int v : list)
    if (v == value) return true;
  return false;
}}

// f(std::integral_constant<int, D>{{}}) for an sm80 kernel head dim D, else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_sm80_head_dim(int kernel_dim, F&& f, Otherwise&& otherwise) {{
  switch (kernel_dim) {{
{sm80_cases}    default: return otherwise();
  }}
}}

// f(integral_constant<D>, integral_constant<DC>) for the TMA instantiation
// computing `columns` columns (kernel head dim D), else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_tma_columns(int columns, F&& f, Otherwise&& otherwise) {{
  switch (columns) {{
{tma_cases}    default: return otherwise();
  }}
}}

// f(std::integral_constant<int, D>{{}}) for a TMA backward head dim D, else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_tma_backward_head_dim(int head_dim, F&& f, Otherwise&& otherwise) {{
  switch (head_dim) {{
{tma_bwd_cases}    default: return otherwise();
  }}
}}

}}  // namespace cuflash::detail::kernel_table
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    wanted = {INST / name: text for name, text in inst_files().items()}
    wanted[HEADER] = header()
    present = set(INST.glob("*.cu"))
    stale = sorted(present - set(wanted))
    if args.check:
        differ = [str(p.relative_to(ROOT)) for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        differ += [str(p.relative_to(ROOT)) + " (not in the table)" for p in stale]
        if differ:
            print("gen_kernel_table.py: not current:\n  " + "\n  ".join(differ), file=sys.stderr)
            return 1
        return 0
    for p in stale:
        p.unlink()
    for p, text in wanted.items():
        if not p.exists() or p.read_text() != text:
            p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
