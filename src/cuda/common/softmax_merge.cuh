// The exact merge of softmax states (partial attentions over disjoint key
// sets) given their log-sum-exps: the weights each side's normalized output
// keeps, and the merged lse. One rule for merge_states, split-free sinks
// (a sink is a state with lse = sink and no value), the split-KV combine and
// their callers.
#pragma once

#include <cmath>

namespace cuflash::detail {

struct MergedLse {
  float lse;       // log(exp(lse_a) + exp(lse_b)); -inf when both are
  float weight_a;  // exp(lse_a - lse): 0 when both sides are empty
  float weight_b;
};

// The rule for any number of states, in two parts. A state's weight before
// normalization, relative to the largest lse `top` of the states merged (so
// no exp overflows): exp(lse - top); 0 where every state is empty (top
// -inf), and for an empty state.
__device__ __forceinline__ float lse_weight(float lse, float top) { return top == -INFINITY ? 0.0f : expf(lse - top); }
// The merged lse from `top` and the sum of the weights: -inf when every
// state is empty. Each state's normalized output keeps weight / total.
__device__ __forceinline__ float merged_lse(float top, float total) {
  return top == -INFINITY ? -INFINITY : top + logf(total);
}

__device__ __forceinline__ MergedLse merge_lse(float lse_a, float lse_b) {
  const float top = fmaxf(lse_a, lse_b);
  if (top == -INFINITY) return {-INFINITY, 0.0f, 0.0f};  // neither side saw a key
  const float ea = lse_weight(lse_a, top), eb = lse_weight(lse_b, top);
  const float total = ea + eb;
  return {merged_lse(top, total), ea / total, eb / total};
}

}  // namespace cuflash::detail
