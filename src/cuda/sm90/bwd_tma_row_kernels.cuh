// The Hopper backward's kernels around its main kernel, per 64-row query
// tile: the preparation (lse2, dsum, the dQ accumulator zeroed) before and
// the dq conversion after (sm90/flash_bwd_tma_launch.cuh).
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm90/bwd_tma_params.cuh"

namespace cuflash::detail::sm90 {

// ---------------------------------------------------------------------------
// Preparation: grid (query tiles, heads_q, batch), 256 threads: lse2 and
// dsum of the tile's 64 padded rows (rows past the sequence 0), the tile's
// dQ accumulator zeroed, and its turn counter. D / 8 threads per row, a
// 16-byte chunk of O and dO each, so that a warp reads whole rows (32 x 16
// contiguous bytes per load: 2 rows at D = 128) and the row's dot product
// is summed by shuffles within its lanes.
// ---------------------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_tma_prep_kernel(const __grid_constant__ TmaBackwardParams tp) {
  const BackwardParams& p = tp.p;
  const int m0 = blockIdx.x * kBwdTileRows, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  if (m0 >= seq.q_len) return;
  const std::int64_t row0 = bwd_padded_row(tp, seq, b, h, m0);
  constexpr int kThreadsPerRow = D / 8;  // one 16-byte chunk each
  static_assert(kThreadsPerRow <= 32 && (kThreadsPerRow & (kThreadsPerRow - 1)) == 0, "whole rows per warp");
  constexpr int kRowsPerPass = 256 / kThreadsPerRow, kPasses = kBwdTileRows / kRowsPerPass;
  const int part = threadIdx.x % kThreadsPerRow, col = part * 8, r0 = threadIdx.x / kThreadsPerRow;
  // A batch of passes' loads first, then their sums: the stores between
  // passes would otherwise keep the compiler from issuing a pass's loads
  // before the last pass's sums are stored (it cannot tell them apart), and
  // each pass would wait out a memory latency of its own. (Batches of four:
  // all eight of D = 256 took 155 registers, one CTA per SM.)
  constexpr int kBatch = kPasses < 4 ? kPasses : 4;
  const T* o = static_cast<const T*>(p.out) + row_offset(p.out_strides, b, seq.q_start, m0 + r0, h) + col;
  const T* d = static_cast<const T*>(p.dout) + row_offset(p.dout_strides, b, seq.q_start, m0 + r0, h) + col;
  const std::int64_t o_step = std::int64_t{kRowsPerPass} * p.out_strides.row;
  const std::int64_t d_step = std::int64_t{kRowsPerPass} * p.dout_strides.row;
#pragma unroll
  for (int k0 = 0; k0 < kPasses; k0 += kBatch) {
    uint4 ov[kBatch], dv[kBatch];
    float lse[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int k = k0 + j, i = m0 + r0 + k * kRowsPerPass;
      ov[j] = dv[j] = make_uint4(0u, 0u, 0u, 0u);
      lse[j] = 0.0f;
      if (part == 0 && i < seq.q_len) lse[j] = p.lse[lse_offset(p, b, seq.q_start, i, h)];
      if (i < seq.q_len && col < p.head_dim) {
        ov[j] = *reinterpret_cast<const uint4*>(o + k * o_step);
        dv[j] = *reinterpret_cast<const uint4*>(d + k * d_step);
      }
    }
    if (k0 == 0) {
      float4* accum = reinterpret_cast<float4*>(tp.dq_accum + row0 * D);
#pragma unroll
      for (int idx = threadIdx.x; idx < kBwdTileRows * D / 4; idx += 256) accum[idx] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int r = r0 + (k0 + j) * kRowsPerPass, i = m0 + r;
      const std::uint32_t* ow = &ov[j].x;
      const std::uint32_t* dw = &dv[j].x;
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = sm80::unpack2<T>(ow[e]), y = sm80::unpack2<T>(dw[e]);
        acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
      }
#pragma unroll
      for (int lanes = kThreadsPerRow / 2; lanes >= 1; lanes /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, lanes);
      if (part == 0) {
        tp.dsum[row0 + r] = acc;
        tp.lse2[row0 + r] = i < seq.q_len ? lse_base2(lse[j]) : 0.0f;
      }
    }
  }
  if (tp.dq_turn != nullptr && threadIdx.x == 0) tp.dq_turn[row0 / kBwdTileRows] = 0;
}

// ---------------------------------------------------------------------------
// Conversion: grid (query tiles, heads_q, batch), 256 threads: dq =
// softmax_scale * the tile's accumulator, rows of the sequence. The tile is
// read in its own order (C::DqOrder), each warp two adjacent n8 column
// blocks at a time (2 x 512 contiguous bytes): lane 4 g + t then holds
// columns 2 t, 2 t + 1 of rows g and g + 8 of both blocks. The four lanes
// of a quad exchange their bf16 pairs so that each holds 8 consecutive
// columns of one row (t = 0, 1: the first block's rows g, g + 8; t = 2, 3:
// the second's), stored as one 16-byte chunk: every 32-byte sector of dq is
// written whole by one store instruction.
// ---------------------------------------------------------------------------
// Lane t of a quad holds words[m] for m = 0 .. 3 (the pairs of the rows and
// blocks that lane m takes); afterwards it holds, at position u, the word
// lane u had for it.
__device__ __forceinline__ void quad_transpose(std::uint32_t (&words)[4], int t) {
  std::uint32_t out[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) out[m] = words[m];  // position t keeps its own word
#pragma unroll
  for (int s = 1; s < 4; ++s) {
    const int partner = t ^ s;  // sends the word for t; t sends it the word for partner
    std::uint32_t send = words[0];
#pragma unroll
    for (int m = 1; m < 4; ++m) send = m == partner ? words[m] : send;
    const std::uint32_t got = __shfl_xor_sync(0xffffffffu, send, s);
#pragma unroll
    for (int m = 0; m < 4; ++m) out[m] = m == partner ? got : out[m];
  }
#pragma unroll
  for (int m = 0; m < 4; ++m) words[m] = m == t ? words[m] : out[m];
}

template <class C>
__global__ void __launch_bounds__(256) flash_bwd_tma_convert_kernel(const __grid_constant__ TmaBackwardParams tp) {
  using T = typename C::Element;
  using Order = typename C::DqOrder;
  constexpr int D = C::D;
  static_assert(Order::kBlocks % 2 == 0, "n8 column blocks in pairs");
  const BackwardParams& p = tp.p;
  const int m0 = blockIdx.x * kBwdTileRows, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  if (m0 >= seq.q_len) return;
  const float4* tile = reinterpret_cast<const float4*>(tp.dq_accum + bwd_padded_row(tp, seq, b, h, m0) * D);
  T* dq = static_cast<T*>(p.dq) + row_offset(p.dq_strides, b, seq.q_start, m0, h);
  const int rows = seq.q_len - m0;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
  constexpr int kPairsPerWarp = kBwdTileRows * D / 256 / 8;  // (a pair: 2 x 32 float4)
  // All loads first (the compiler cannot tell dq's stores from the tile).
  float4 first[kPairsPerWarp], second[kPairsPerWarp];
#pragma unroll
  for (int k = 0; k < kPairsPerWarp; ++k) {
    const int pair = warp + 8 * k;
    first[k] = tile[64 * pair + lane];
    second[k] = tile[64 * pair + 32 + lane];
  }
#pragma unroll
  for (int k = 0; k < kPairsPerWarp; ++k) {
    const auto at = Order::quad(64 * (warp + 8 * k) + lane);  // (row g, column 2 t) of the first block
    const float s = p.softmax_scale;
    std::uint32_t words[4] = {sm80::pack2<T>(first[k].x * s, first[k].y * s),
                              sm80::pack2<T>(first[k].z * s, first[k].w * s),
                              sm80::pack2<T>(second[k].x * s, second[k].y * s),
                              sm80::pack2<T>(second[k].z * s, second[k].w * s)};
    quad_transpose(words, t);
    const int row = at.row + 8 * (t & 1), col = at.col - 2 * t + 8 * (t >> 1);
    if (row < rows && col < p.head_dim)
      *reinterpret_cast<uint4*>(dq + static_cast<std::int64_t>(row) * p.dq_strides.row + col) =
          make_uint4(words[0], words[1], words[2], words[3]);
  }
}

}  // namespace cuflash::detail::sm90
