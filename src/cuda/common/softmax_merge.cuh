// The exact merge of two softmax states (partial attentions over disjoint key
// sets) given their log-sum-exps: the weights each side's normalized output
// keeps, and the merged lse. One rule for merge_states, split-free sinks
// (a sink is a state with lse = sink and no value) and their callers.
#pragma once

#include <cmath>

namespace cuflash::detail {

struct MergedLse {
  float lse;       // log(exp(lse_a) + exp(lse_b)); -inf when both are
  float weight_a;  // exp(lse_a - lse): 0 when both sides are empty
  float weight_b;
};

__device__ __forceinline__ MergedLse merge_lse(float lse_a, float lse_b) {
  const float top = fmaxf(lse_a, lse_b);
  if (top == -INFINITY) return {-INFINITY, 0.0f, 0.0f};  // neither side saw a key
  // Relative to the larger side, so neither exp overflows.
  const float ea = expf(lse_a - top), eb = expf(lse_b - top);
  const float total = ea + eb;
  return {top + logf(total), ea / total, eb / total};
}

}  // namespace cuflash::detail
