// The online softmax of one query row, in base 2, as the tensor-core kernels
// hold it: the row's scores of a key tile are spread over the four lanes of
// a quad (t4 = lane % 4) of the mma m16n8 accumulator layout, two per n8
// block. The state is the row's running max (of the unscaled logits) and
// the thread's running sum of exp2; `mult` turns a logit into base 2 at the
// exponent (1 where the logits are already base 2). One rule for the
// prefill forwards (sm80, wgmma, TMA: forward_block.cuh) and the decode.
#pragma once

#include <cmath>

#include "common/tensor_core.cuh"

namespace cuflash::detail {

// One key tile's step: the row's max over the quad's values, then each
// value x becomes exp2(x * mult - max * mult) in place and the sum grows by
// them. Returns the factor O accumulated so far (and the old sum, already
// scaled here) must be scaled by: exp2 of the old max minus the new, 0 on
// the first tile (old max -inf) and 1 while the max stays. A row whose
// values are all -inf so far keeps max -inf and exponentiates against 0, so
// its values stay 0 (ex2 of -inf is +0). value(nt, e): the thread's e-th
// (0, 1) value of n8 block nt, as a reference.
template <int NT, class Value>
__device__ __forceinline__ float online_softmax_row_step(Value&& value, float& row_max, float& row_sum, float mult) {
  float mx = row_max;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) mx = fmaxf(mx, fmaxf(value(nt, 0), value(nt, 1)));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_scaled = mx == -INFINITY ? 0.0f : mx * mult;
  const float correction = sm80::fast_exp2(row_max * mult - m_scaled);
  row_max = mx;
  float sum = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = value(nt, e);
      x = sm80::fast_exp2(fmaf(x, mult, -m_scaled));
      sum += x;
    }
  row_sum = row_sum * correction + sum;
  return correction;
}

// The row's whole sum: the thread's part added over its quad.
__device__ __forceinline__ float online_softmax_row_total(float row_sum) {
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
  return row_sum;
}

}  // namespace cuflash::detail
