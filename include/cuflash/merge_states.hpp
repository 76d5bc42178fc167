// merge_states: the exact combination of two partial attentions over disjoint
// key sets, from their outputs and log-sum-exps:
//   lse = log(exp(lse_a) + exp(lse_b))
//   out = exp(lse_a - lse) * out_a + exp(lse_b - lse) * out_b
// The building block of split-KV decode, cascades and ring attention.
#pragma once

#include "cuflash/options.hpp"
#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash {

struct MergeArgs {
  // out_* [B, S, H, D] (any dtype of f32/f16/bf16, all the same; or out_a
  // and out f32 with out_b f16/bf16, to accumulate partials in fp32);
  // lse_* float32 [B, H, S]. B, S or H may be 0 (nothing to merge; views
  // without elements may have null data); D may not.
  TensorView out_a, lse_a;
  TensorView out_b, lse_b;
  // May be exactly out_a / lse_a (same data and strides) to merge in place;
  // any other overlap with an input is an error.
  TensorView out, lse;
};

Status merge_states(const MergeArgs& args, Backend backend = Backend::automatic,
                    const RunContext& context = {});

}  // namespace cuflash
