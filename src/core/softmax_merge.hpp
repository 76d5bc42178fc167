// The exact merge of softmax states (partial attentions over disjoint key
// sets) given their log-sum-exps: the weights each side's normalized output
// keeps, and the merged lse. One rule, host and device, in float on the GPU
// and in double in the CPU reference: merge_states (both backends),
// split-free sinks (a sink is a state with lse = sink and no value), the
// split-KV combine and their callers (the ring steps merge through
// merge_states).
#pragma once

#include <cmath>

#include "host_device.hpp"

namespace cuflash::detail {

// (Overloads, so that float stays in float math on both sides.)
CUFLASH_HOST_DEVICE float merge_exp(float x) { return expf(x); }
CUFLASH_HOST_DEVICE double merge_exp(double x) { return exp(x); }
CUFLASH_HOST_DEVICE float merge_log(float x) { return logf(x); }
CUFLASH_HOST_DEVICE double merge_log(double x) { return log(x); }
CUFLASH_HOST_DEVICE float merge_max(float a, float b) { return fmaxf(a, b); }
CUFLASH_HOST_DEVICE double merge_max(double a, double b) { return fmax(a, b); }

// The rule for any number of states, in two parts. A state's weight before
// normalization, relative to the largest lse `top` of the states merged (so
// no exp overflows): exp(lse - top); 0 where every state is empty (top
// -inf), and for an empty state.
template <class Real>
CUFLASH_HOST_DEVICE Real lse_weight(Real lse, Real top) {
  return top == -INFINITY ? Real(0) : merge_exp(lse - top);
}
// The merged lse from `top` and the sum of the weights: -inf when every
// state is empty. Each state's normalized output keeps weight / total.
template <class Real>
CUFLASH_HOST_DEVICE Real merged_lse(Real top, Real total) {
  return top == -INFINITY ? Real(-INFINITY) : top + merge_log(total);
}

template <class Real>
struct MergedLseOf {
  Real lse;       // log(exp(lse_a) + exp(lse_b)); -inf when both are
  Real weight_a;  // exp(lse_a - lse): 0 when both sides are empty
  Real weight_b;
};
using MergedLse = MergedLseOf<float>;

template <class Real>
CUFLASH_HOST_DEVICE MergedLseOf<Real> merge_lse(Real lse_a, Real lse_b) {
  const Real top = merge_max(lse_a, lse_b);
  if (top == -INFINITY) return {Real(-INFINITY), Real(0), Real(0)};  // neither side saw a key
  const Real ea = lse_weight(lse_a, top), eb = lse_weight(lse_b, top);
  const Real total = ea + eb;
  return {merged_lse(top, total), ea / total, eb / total};
}

}  // namespace cuflash::detail
