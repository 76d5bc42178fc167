// f16/bf16 calls whose head dim is not a multiple of 8: their rows are not
// whole 16-byte chunks, which every tensor-core kernel loads and stores. Such
// a call runs on copies of its head-dim tensors padded with zero columns to
// the next multiple of 8 (contiguous, in the call's workspace), and its
// outputs are copied back without the padding. Zero columns add nothing to
// QK^T, and the output columns they make are dropped; the softmax scale is
// the caller's (problem.softmax_scale, resolved from the unpadded head dim).
// flash-attn pads such head dims too (in Python); here C++, C and Python
// callers share it. A KV cache is copied whole, and written back whole when
// the call appends to it: O(cache) per call, where a multiple of 8 reads
// only the keys it attends to.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// Whether `problem` runs on padded copies (f16/bf16, head_dim % 8 != 0).
bool needs_padded_head_dim(const Problem& problem);

// The problem the kernels see: every head-dim view (q, k, v, out, k_new,
// v_new; backward: out, dout, dq, dk, dv) replaced by a contiguous copy of
// head dim rounded up to 8, placed from `scratch` on (nullptr: placement only,
// for sizes). `bytes`: the scratch the copies take (a multiple of 256).
struct PaddedHeadDim {
  Problem problem;
  std::size_t bytes = 0;
};
PaddedHeadDim padded_head_dim(const Problem& problem, void* scratch);

// Inputs into the padded copies (zero columns past the head dim).
Status pad_head_dim_inputs(const Problem& problem, const Problem& padded, cudaStream_t stream);
// Outputs back from the padded copies: out (and an appended-to cache), or dq, dk, dv.
Status unpad_head_dim_outputs(const Problem& problem, const Problem& padded, cudaStream_t stream);

}  // namespace cuflash::detail
