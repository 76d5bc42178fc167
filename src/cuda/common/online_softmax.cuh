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

// How the running max follows the tiles' maxima. `exact`: raised to every
// larger one. `lagging`: raised only where a tile's lies more than
// kMaxLagLog2 (base 2) above it. Any max gives the exact softmax (the same
// one scales P and the sum, and the lse adds it back); the running max only
// has to keep exp2(x - max) from overflowing: below 2^8 here, which fp32
// sums and O, and bf16/fp16 P, hold as exactly as values below 1. While it
// stays, the correction is exactly 1 and the caller skips O's rescale
// (rescale_moved_rows_m16): D / 2 multiplies per thread and tile, at
// D = 256 more instructions than the tile's exponentials. After the first
// tiles the max of random scores almost never rises that far. (The sm80
// forward and the decode keep `exact`: in the sm80 kernel, whose register
// allocation was tuned by measurement, the lag's extra live state took
// spill stores from 40 to 52 bytes at D = 128, two of them in the tile
// loop; the decode already skips O's rescale where the max stays.)
enum class RunningMax { exact, lagging };
constexpr float kMaxLagLog2 = 8.0f;

// One key tile's step: the row's max over the quad's values, then each
// value x becomes exp2(x * mult - max * mult) in place and the sum grows by
// them, where max is the running max (raised as `Max` says; from -inf
// always). Returns the factor O accumulated so far (and the old sum,
// already scaled here) must be scaled by: exp2 of the old max minus the
// new, 0 on the first tile (old max -inf) and exactly 1 while the max
// stays. A row whose values are all -inf so far keeps max -inf and
// exponentiates against 0, so its values stay 0 (ex2 of -inf is +0).
// value(nt, e): the thread's e-th (0, 1) value of n8 block nt, as a
// reference.
template <int NT, RunningMax Max, class Value>
__device__ __forceinline__ float online_softmax_row_step(Value&& value, float& row_max, float& row_sum, float mult) {
  // The max in kChains interleaved chains, not one: every exponential
  // waits for it, and one chain of NT dependent FMNMX (ptxas does not
  // reassociate them) sat between the scores and the first MUFU. (A full
  // tree holds NT partial maxima at once, which cost the register-bound
  // kernels spills.) A max is exact in any order: bitwise the chain's.
  constexpr int kChains = NT < 4 ? NT : 4;
  float part[kChains];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float pair = fmaxf(value(nt, 0), value(nt, 1));
    part[nt % kChains] = nt < kChains ? pair : fmaxf(part[nt % kChains], pair);
  }
#pragma unroll
  for (int c = 1; c < kChains; ++c) part[0] = fmaxf(part[0], part[c]);
  float mx = fmaxf(row_max, part[0]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  // (A difference that is not a number raises, as `exact` does.)
  const bool keep = Max == RunningMax::lagging && row_max != -INFINITY && (mx - row_max) * mult <= kMaxLagLog2;
  const float new_max = keep ? row_max : mx;
  const float m_scaled = new_max == -INFINITY ? 0.0f : new_max * mult;
  const float correction = keep ? 1.0f : sm80::fast_exp2(row_max * mult - m_scaled);
  row_max = new_max;
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
