// Dropout's mask (src/core/philox.hpp, one definition for the CPU, the oracle
// and the kernels) in the mma.sync accumulator layout the forward and backward
// kernels hold scores in: a lane has keys 2 t4 and 2 t4 + 1 of each n8 block
// for rows g and g + 8. Both keys of a pair come from one Philox block (the
// block covers keys 4 (j / 4) .. + 3), so a pair costs one philox4x32_10.
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "philox.hpp"

namespace cuflash::detail {

// The mask of one (sequence b, query head h) and the factor of a kept entry.
struct DropoutHead {
  DropoutRng rng;
  std::uint64_t stream = 0;
  float keep_scale = 1.0f;
};

__device__ __forceinline__ DropoutHead dropout_head(const AttentionParams& p, int b, int h) {
  return {p.dropout, dropout_stream(p.dropout, b, h, p.heads_q), p.dropout_keep_scale};
}

// Z of entry (b, h, i, j): 1 / (1 - p) when kept, 0 when dropped, 1 without
// dropout; for the kernels that take one entry at a time (the f32 path).
__device__ __forceinline__ float dropout_factor(const AttentionParams& p, int b, int h, int i, int j) {
  if (!p.has_dropout) return 1.0f;
  return dropout_keeps(p.dropout, b, h, p.heads_q, i, j) ? p.dropout_keep_scale : 0.0f;
}

// Bit 0: key `key_even` of `row` is kept; bit 1: key `key_even + 1` is.
// `key_even` is even. A threshold of 0 keeps everything.
__device__ __forceinline__ unsigned dropout_keep_pair(const DropoutRng& rng, std::uint64_t stream, int row,
                                                      int key_even) {
  const Philox4x32 draws = dropout_draws_in_stream(rng, stream, row, key_even);
  const bool upper = (key_even & 2) != 0;
  const std::uint32_t first = upper ? draws.word[2] : draws.word[0];
  const std::uint32_t second = upper ? draws.word[3] : draws.word[1];
  return (first >= rng.threshold ? 1u : 0u) | (second >= rng.threshold ? 2u : 0u);
}

// Keep bits of a warp's MT x NT tile of accumulator fragments whose row g
// (half 0) of m16 tile 0 is i0 and whose key 0 is n0: bit 2 k + e for key
// 2 t4 + e of fragment k = (2 mt + half) * NT + nt. The draws run in a loop
// kept rolled: unrolled, the Philox blocks' ten rounds interleave and their
// state takes registers the kernels do not have (the sm80 forward spilled
// 748 bytes that way).
template <int MT, int NT>
__device__ __forceinline__ std::uint64_t dropout_keep_bits(const DropoutHead& drop, int i0, int n0, int t4) {
  static_assert(MT * 2 * NT * 2 <= 64, "one 64-bit word of keep bits per tile");
  std::uint64_t bits = 0;
#pragma unroll 1
  for (int k = 0; k < MT * 2 * NT; ++k) {
    const int nt = k % NT, row_tile = k / NT;  // row_tile = 2 mt + half
    const int row = i0 + (row_tile >> 1) * 16 + (row_tile & 1) * 8;
    bits |= static_cast<std::uint64_t>(dropout_keep_pair(drop.rng, drop.stream, row, n0 + nt * 8 + 2 * t4)) << (2 * k);
  }
  return bits;
}

// Whether entry e (0, 1) of fragment (row_tile, nt) is kept, from dropout_keep_bits.
template <int NT>
__device__ __forceinline__ bool dropout_kept(std::uint64_t bits, int row_tile, int nt, int e) {
  return (bits >> (2 * (row_tile * NT + nt) + e)) & 1u;
}

// Zeroes the dropped entries of a warp's m16 x (8 NT) tile of probabilities
// whose row g (half 0) is i0 and whose key 0 is n0. The row sums were taken
// before: dropout acts on the normalized probabilities, so the softmax
// state does not see it; the kept entries' 1 / (1 - p) is applied once to
// the output rows.
template <int NT>
__device__ __forceinline__ void drop_probabilities_m16(float (&s)[NT][4], const DropoutHead& drop, int i0, int n0,
                                                       int t4) {
  const std::uint64_t bits = dropout_keep_bits<1, NT>(drop, i0, n0, t4);
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (!dropout_kept<NT>(bits, half, nt, e)) s[nt][half * 2 + e] = 0.0f;
}

}  // namespace cuflash::detail
