// The tensor-core kernels' instantiations, (kernel, element type, head dim),
// for the host: which head dims each kernel has, and the switches from a
// runtime head dim to an instantiated kernel's template arguments. Written by
// scripts/gen_kernel_table.py with the instantiation files in src/cuda/inst/
// (edit the table there and run it, not this file); every element type
// (bf16, fp16) has every entry.
#pragma once

#include <type_traits>

namespace cuflash::detail::kernel_table {

// sm80 forward, backward and decode kernel head dims, ascending.
inline constexpr int kSm80HeadDims[] = {32, 64, 96, 128, 192, 256};
// The cp.async wgmma forward's head dims.
inline constexpr int kWgmmaHeadDims[] = {64, 128, 192, 256};

// The TMA forward: (kernel head dim, columns computed); columns below the
// kernel dim serve narrower callers' head dims.
struct TmaInstance {
  int head_dim, columns;
};
inline constexpr TmaInstance kTmaInstances[] = {{64, 64}, {64, 48}, {128, 128}, {128, 80}, {128, 96}, {192, 192}, {256, 256}};
// The TMA backward's head dims (the caller's must be one of them).
inline constexpr int kTmaBackwardHeadDims[] = {64, 128, 256};

template <int N>
constexpr bool contains(const int (&list)[N], int value) {
  for (int v : list)
    if (v == value) return true;
  return false;
}

// f(std::integral_constant<int, D>{}) for an sm80 kernel head dim D, else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_sm80_head_dim(int kernel_dim, F&& f, Otherwise&& otherwise) {
  switch (kernel_dim) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 192: return f(std::integral_constant<int, 192>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return otherwise();
  }
}

// f(integral_constant<D>, integral_constant<DC>) for the TMA instantiation
// computing `columns` columns (kernel head dim D), else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_tma_columns(int columns, F&& f, Otherwise&& otherwise) {
  switch (columns) {
    case 48: return f(std::integral_constant<int, 64>{}, std::integral_constant<int, 48>{});
    case 64: return f(std::integral_constant<int, 64>{}, std::integral_constant<int, 64>{});
    case 80: return f(std::integral_constant<int, 128>{}, std::integral_constant<int, 80>{});
    case 96: return f(std::integral_constant<int, 128>{}, std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{}, std::integral_constant<int, 128>{});
    case 192: return f(std::integral_constant<int, 192>{}, std::integral_constant<int, 192>{});
    case 256: return f(std::integral_constant<int, 256>{}, std::integral_constant<int, 256>{});
    default: return otherwise();
  }
}

// f(std::integral_constant<int, D>{}) for a TMA backward head dim D, else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_tma_backward_head_dim(int head_dim, F&& f, Otherwise&& otherwise) {
  switch (head_dim) {
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return otherwise();
  }
}

}  // namespace cuflash::detail::kernel_table
