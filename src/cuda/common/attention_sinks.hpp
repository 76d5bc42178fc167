// Attention sinks (gpt-oss) on the GPU without touching the attention
// kernels: a sink is one more softmax state with lse = sinks[h] and no
// value, so the forward runs as if there were none and then merges that state
// into every row (out *= exp(lse - lse'), lse' = log(exp(lse) + exp(sink));
// softmax_merge.hpp's rule). The backward needs nothing more for dq, dk, dv
// (P and D = rowsum(dout * out) come from the final out and lse), and
//   dsinks[h] = -sum over rows of exp(sinks[h] - lse) * dot(dout, out),
// reduced per block and then in a fixed order (deterministic).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "problem.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Forward, after the kernels: problem.out and `lse` (the caller's, or scratch
// of lse's shape when the caller gave none) take the sinks in.
Status apply_attention_sinks(const Problem& problem, const TensorView& lse, cudaStream_t stream);

// Backward: problem.dsinks (when given) from dout, out, lse and sinks.
std::size_t attention_sinks_backward_bytes(const Problem& problem);
Status attention_sinks_backward(const Problem& problem, void* workspace, cudaStream_t stream);

// The contiguous float32 lse of a forward (dense/KV cache [B, Hq, Sq], varlen [Hq, Tq]) over `data`.
TensorView scratch_lse_view(const Problem& problem, void* data);

}  // namespace cuflash::detail
