// The head dims the tensor-core kernels are instantiated for (src/cuda/inst),
// and the one place that turns a caller's head dim into the template argument.
//
// A head dim that is a multiple of 8 and at most 256 runs on the smallest
// instantiated kernel dim at or above it (80 on the 96 kernel, 40 on 64): the
// kernels load and store only the caller's columns (16-byte chunks, so a
// multiple of 8 elements) and zero-fill the rest of their tiles in shared
// memory, where the extra columns add zeros to QK^T and produce output
// columns nobody stores. Other head dims (not whole 16-byte rows) are padded
// by the backend (narrow_head_dim.hpp) before they reach a kernel.
#pragma once

#include <iterator>
#include <string>
#include <utility>

#include "common/kernel_table.hpp"

namespace cuflash::detail::sm80 {

// The instantiated kernel dims (scripts/gen_kernel_table.py's table), ascending.
inline constexpr const auto& kHeadDims = kernel_table::kSm80HeadDims;
inline constexpr int kMaxHeadDim = kHeadDims[std::size(kHeadDims) - 1];
inline constexpr int kHeadDimAlign = 8;  // elements per 16-byte chunk of f16/bf16

// The kernel head dim a caller's head dim runs on; 0 when none does.
constexpr int kernel_head_dim(int head_dim) {
  if (head_dim <= 0 || head_dim % kHeadDimAlign != 0) return 0;
  for (int d : kHeadDims)
    if (d >= head_dim) return d;
  return 0;
}

// The smallest caller head dim that kernel dim D serves (its columns below
// this are always real, so loops over them need no bound check).
constexpr int min_head_dim_served(int kernel_dim) {
  int previous = 0;
  for (int d : kHeadDims) {
    if (d == kernel_dim) return previous + kHeadDimAlign;
    previous = d;
  }
  return kernel_dim;
}

// The 16-byte chunk a K/V load reads for chunk `chunk` of a kernel row: its
// own, or for a chunk past a narrower caller head dim the row's first (never
// past the caller's row). Those shared-memory columns then hold copies of real
// keys and values, which change nothing: the query's columns there are zeros,
// and the output columns they make are never stored. No predicate, so a load
// loop keeps the registers of the full-width kernel.
constexpr int chunk_to_read(int chunk, int head_dim) { return chunk * kHeadDimAlign < head_dim ? chunk : 0; }

// For error messages: what the tensor-core kernels take.
inline std::string head_dim_rule() {
  return "multiples of " + std::to_string(kHeadDimAlign) + " up to " + std::to_string(kMaxHeadDim);
}

// f(std::integral_constant<int, D>{}) for D = kernel_head_dim(head_dim), else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_head_dim(int head_dim, F&& f, Otherwise&& otherwise) {
  return kernel_table::with_sm80_head_dim(kernel_head_dim(head_dim), std::forward<F>(f),
                                          std::forward<Otherwise>(otherwise));
}

}  // namespace cuflash::detail::sm80
