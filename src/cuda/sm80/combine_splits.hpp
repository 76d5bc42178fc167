// The second pass of split-KV (the prefill forward's small grids and the
// decode kernel): merges num_splits partial (out, lse) per query row, the
// n-way form of merge_states, into out and lse.
#pragma once

#include <cuda_runtime_api.h>

#include "common/attention_params.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Reads p.out_partial / p.lse_partial ([split][b][h][row], row < max_q_len;
// see ForwardParams) and writes out (element type T: __half or
// __nv_bfloat16) and, when given, lse. Every split must have written its
// rows, lse -inf and out 0 where it saw no key.
template <typename T>
Status launch_combine_splits(const ForwardParams& p, cudaStream_t stream);

}  // namespace cuflash::detail
