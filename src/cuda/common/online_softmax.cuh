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

// The hook of online_softmax_rows_step that does nothing.
struct NoMidway {
  template <int Rows>
  __device__ __forceinline__ void operator()(const float (&)[Rows]) const {}
};

// One key tile's step for `Rows` rows at once: each row's max over the
// quad's values, then each value x becomes exp2(x * mult - max * mult) in
// place and the row's sum grows by them, where max is the running max
// (raised as `Max` says; from -inf always). correction[r]: the factor O
// accumulated so far (and the old sum, already scaled here) must be scaled
// by: exp2 of the old max minus the new, 0 on the first tile (old max -inf)
// and exactly 1 while the max stays. A row whose values are all -inf so far
// keeps max -inf and exponentiates against 0, so its values stay 0 (ex2 of
// -inf is +0). value(r, nt, e): row r's e-th (0, 1) value of n8 block nt,
// as a reference. midway(partial sums): called once the first NT / 2 blocks'
// exponentials are summed (a caller's scheduling hook, wgmma_wait_pin.cuh).
// With several rows their chains interleave (the maxima, the shuffles, the
// exponentials block by block), so one row's latency hides under the
// other's work; each row's arithmetic is in the same order as alone, so the
// results are bitwise those of Rows = 1.
template <int NT, int Rows, RunningMax Max, class Value, class Midway = NoMidway>
__device__ __forceinline__ void online_softmax_rows_step(Value&& value, float (&row_max)[Rows], float (&row_sum)[Rows],
                                                         float (&correction)[Rows], float mult,
                                                         Midway&& midway = {}) {
  // The max in kChains interleaved chains, not one: every exponential
  // waits for it, and one chain of NT dependent FMNMX (ptxas does not
  // reassociate them) sat between the scores and the first MUFU. (A full
  // tree holds NT partial maxima at once, which cost the register-bound
  // kernels spills.) A max is exact in any order: bitwise the chain's.
  constexpr int kChains = NT < 4 ? NT : 4;
  float part[Rows][kChains];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int r = 0; r < Rows; ++r) {
      const float pair = fmaxf(value(r, nt, 0), value(r, nt, 1));
      part[r][nt % kChains] = nt < kChains ? pair : fmaxf(part[r][nt % kChains], pair);
    }
  float mx[Rows];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
#pragma unroll
    for (int c = 1; c < kChains; ++c) part[r][0] = fmaxf(part[r][0], part[r][c]);
    mx[r] = fmaxf(row_max[r], part[r][0]);
  }
#pragma unroll
  for (int lane_mask = 1; lane_mask <= 2; lane_mask *= 2)
#pragma unroll
    for (int r = 0; r < Rows; ++r) mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], lane_mask));
  float m_scaled[Rows], sum[Rows];
#pragma unroll
  for (int r = 0; r < Rows; ++r) {
    // (A difference that is not a number raises, as `exact` does.) `&`, not
    // `&&`: the short circuit became two branches per row.
    const bool keep = (Max == RunningMax::lagging) & (row_max[r] != -INFINITY) &
                      ((mx[r] - row_max[r]) * mult <= kMaxLagLog2);
    const float new_max = keep ? row_max[r] : mx[r];
    m_scaled[r] = new_max == -INFINITY ? 0.0f : new_max * mult;
    correction[r] = keep ? 1.0f : sm80::fast_exp2(row_max[r] * mult - m_scaled[r]);
    row_max[r] = new_max;
    sum[r] = 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int r = 0; r < Rows; ++r)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = value(r, nt, e);
        x = sm80::fast_exp2(fmaf(x, mult, -m_scaled[r]));
        sum[r] += x;
      }
    if (nt == NT / 2 - 1) midway(sum);
  }
#pragma unroll
  for (int r = 0; r < Rows; ++r) row_sum[r] = row_sum[r] * correction[r] + sum[r];
}

// The step of one row: returns its correction.
template <int NT, RunningMax Max, class Value>
__device__ __forceinline__ float online_softmax_row_step(Value&& value, float& row_max, float& row_sum, float mult) {
  float correction[1];
  online_softmax_rows_step<NT, 1, Max>([&](int, int nt, int e) -> float& { return value(nt, e); },
                                       reinterpret_cast<float(&)[1]>(row_max), reinterpret_cast<float(&)[1]>(row_sum),
                                       correction, mult);
  return correction[0];
}

// The row's whole sum: the thread's part added over its quad.
__device__ __forceinline__ float online_softmax_row_total(float row_sum) {
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
  row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
  return row_sum;
}

}  // namespace cuflash::detail
