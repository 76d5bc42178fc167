// The debug probabilities of a forward (flash-attn's S_dmask):
// attn_probs[b, h, i, j] = exp(s_ij - lse_i) where key j is visible, else 0,
// negated where dropout drops the entry (src/core/philox.hpp's mask),
// from the forward's final lse (sinks included), recomputed per element with
// the kernels' score rules (score_mask.cuh). For tests; kept simple: one
// block per query row, no tensor cores. Dense and varlen layouts.
#pragma once

#include <cuda_runtime_api.h>

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"
#include "problem.hpp"

namespace cuflash::detail {

Status write_attention_probs(const Problem& problem, const TensorView& lse, cudaStream_t stream);

}  // namespace cuflash::detail
