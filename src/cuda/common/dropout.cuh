// Dropout's mask (src/core/philox.hpp, one definition for the CPU, the oracle
// and the kernels) in the mma.sync accumulator layout the forward and backward
// kernels hold scores in: a lane has keys 2 t4 and 2 t4 + 1 of each n8 block
// for rows g and g + 8. One Philox block gives the 16-bit draws of the eight
// keys 8 m .. 8 m + 7 of a row, i.e. exactly one (row, n8 block) fragment of
// a quad (the four lanes t4 = 0..3 of a row g): the quad computes four blocks
// at a time, one per lane, and shares the keep bytes with shuffles.
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

// Keep bits of a warp's MT x NT tile of accumulator fragments whose row g
// (half 0) of m16 tile 0 is i0 and whose key 0 is n0: bit 2 k + e for key
// 2 t4 + e of fragment k = (2 mt + half) * NT + nt. Fragment k is one Philox
// block (row, keys n0 + 8 nt .. + 7), the same for the four lanes of a quad
// (lane = 4 g + t4): for each group of four fragments, lane t4 computes the
// keep byte of fragment 4 group + t4 only, and each lane takes the four
// bytes from its quad (__shfl_sync of width 4) and keeps bits 2 t4, 2 t4 + 1
// of each. So a lane runs MT * 2 * NT / 4 Philox blocks. Every lane of the
// warp must call this (the shuffles use the full mask); the loop's trip count
// is the same for all lanes. The draws run in a loop kept rolled: unrolled,
// the Philox blocks' ten rounds interleave and their state takes registers
// the kernels do not have (the sm80 forward spilled 748 bytes that way).
template <int MT, int NT>
__device__ __forceinline__ std::uint64_t dropout_keep_bits(const DropoutHead& drop, int i0, int n0, int t4) {
  constexpr int kFragments = MT * 2 * NT;
  static_assert(kFragments * 2 <= 64, "one 64-bit word of keep bits per tile");
  static_assert(kFragments % 4 == 0, "the four lanes of a quad take one fragment each");
  std::uint64_t bits = 0;
#pragma unroll 1
  for (int group = 0; group < kFragments / 4; ++group) {
    const int k = 4 * group + t4;  // this lane's fragment
    const int nt = k % NT, row_tile = k / NT;  // row_tile = 2 mt + half
    const int row = i0 + (row_tile >> 1) * 16 + (row_tile & 1) * 8;
    // dropout_keep_byte without its threshold16 == 0 shortcut (the byte is
    // 0xFF then anyway): no branch before the shuffles.
    const std::uint32_t byte =
        dropout_keep_byte_of(dropout_draws_in_stream(drop.rng, drop.stream, row, n0 + nt * 8), drop.rng.threshold16);
    std::uint32_t mine = 0;  // bits 2 x + e: entry e of fragment 4 group + x
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const std::uint32_t shared = __shfl_sync(0xffffffffu, byte, x, 4);
      mine |= ((shared >> (2 * t4)) & 3u) << (2 * x);
    }
    bits |= static_cast<std::uint64_t>(mine) << (8 * group);
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
