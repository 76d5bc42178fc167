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
// Preparation: grid (query tiles, heads_q, batch), 256 threads, 4 per row:
// lse2 and dsum of the tile's 64 padded rows (rows past the sequence 0),
// the tile's dQ accumulator zeroed, and its turn counter.
// ---------------------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_tma_prep_kernel(const __grid_constant__ TmaBackwardParams tp) {
  const BackwardParams& p = tp.p;
  const int m0 = blockIdx.x * kBwdTileRows, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  if (m0 >= seq.q_len) return;
  const std::int64_t row0 = bwd_padded_row(tp, seq, b, h, m0);
  const int r = threadIdx.x / 4, part = threadIdx.x % 4;
  constexpr int kChunks = D / 8 / 4;  // 16-byte chunks per thread
  float acc = 0.0f;
  const int i = m0 + r;
  if (i < seq.q_len) {
    const T* o = static_cast<const T*>(p.out) + row_offset(p.out_strides, b, seq.q_start, i, h);
    const T* d = static_cast<const T*>(p.dout) + row_offset(p.dout_strides, b, seq.q_start, i, h);
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int col = (u * 4 + part) * 8;
      if (col < p.head_dim) {
        const uint4 ov = *reinterpret_cast<const uint4*>(o + col);
        const uint4 dv = *reinterpret_cast<const uint4*>(d + col);
        const std::uint32_t* ow = &ov.x;
        const std::uint32_t* dw = &dv.x;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 a = sm80::unpack2<T>(ow[e]), c = sm80::unpack2<T>(dw[e]);
          acc = fmaf(a.x, c.x, fmaf(a.y, c.y, acc));
        }
      }
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (part == 0) {
    tp.dsum[row0 + r] = acc;
    tp.lse2[row0 + r] = i < seq.q_len ? lse_base2(p.lse[lse_offset(p, b, seq.q_start, i, h)]) : 0.0f;
  }
  if (tp.dq_turn != nullptr && threadIdx.x == 0) tp.dq_turn[row0 / kBwdTileRows] = 0;
  float4* accum = reinterpret_cast<float4*>(tp.dq_accum + row0 * D);
  for (int idx = threadIdx.x; idx < kBwdTileRows * D / 4; idx += 256) accum[idx] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// ---------------------------------------------------------------------------
// Conversion: grid (query tiles, heads_q, batch), 256 threads: dq =
// softmax_scale * the tile's accumulator (C::DqOrder), rows of the sequence.
// ---------------------------------------------------------------------------
template <class C>
__global__ void __launch_bounds__(256) flash_bwd_tma_convert_kernel(const __grid_constant__ TmaBackwardParams tp) {
  using T = typename C::Element;
  constexpr int D = C::D;
  const BackwardParams& p = tp.p;
  const int m0 = blockIdx.x * kBwdTileRows, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  if (m0 >= seq.q_len) return;
  const float* tile = tp.dq_accum + bwd_padded_row(tp, seq, b, h, m0) * D;
  constexpr int kChunksPerRow = D / 8;
  for (int idx = threadIdx.x; idx < kBwdTileRows * kChunksPerRow; idx += 256) {
    const int r = idx / kChunksPerRow, col = (idx % kChunksPerRow) * 8;
    const int i = m0 + r;
    if (i >= seq.q_len || col >= p.head_dim) continue;
    std::uint32_t words[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 v = *reinterpret_cast<const float2*>(tile + C::DqOrder::index(r, col + 2 * e));
      words[e] = sm80::pack2<T>(v.x * p.softmax_scale, v.y * p.softmax_scale);
    }
    *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + row_offset(p.dq_strides, b, seq.q_start, i, h) + col) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
}


}  // namespace cuflash::detail::sm90
