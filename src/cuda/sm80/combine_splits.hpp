// The second pass of split-KV (the prefill forward's small grids and the
// decode kernel): merges num_splits partial (out, lse) per query row, the
// n-way form of merge_states, into out and lse.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_params.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Reads p.out_partial / p.lse_partial ([split][b][h][row], row < max_q_len;
// see ForwardParams) and writes out (element type T: __half or
// __nv_bfloat16) and, when given, lse. Every split must have written its
// rows, lse -inf and out 0 where it saw no key.
template <typename T>
Status launch_combine_splits(const ForwardParams& p, cudaStream_t stream);

// Workspace of the partials of `splits` splits of the problem's merged rows
// (batch x heads_q x max_q_len) of head_dim floats: out_partial, then
// lse_partial, each at a 256-byte boundary; 0 when splits <= 1. Every kernel
// that splits sizes and places its partials with these two, so they agree
// with the layout the combine reads.
std::size_t split_partials_bytes(const Problem& problem, int splits);

// Sets p.num_splits and, with splits > 1, p.out_partial and p.lse_partial
// inside `workspace` (split_partials_bytes of p's problem and splits bytes).
void place_split_partials(ForwardParams& p, int splits, void* workspace);

}  // namespace cuflash::detail
