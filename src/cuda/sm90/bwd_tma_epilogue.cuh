// The Hopper backward's epilogue (both main kernels): a consumer
// warpgroup's dK (times softmax_scale) and dV accumulators staged as T in
// the CTA's K / V tiles, swizzled as loaded (conflict-free stores), then a
// rectangle of rows x 16-byte chunks of them stored to dk / dv.
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm90/bwd_tma_params.cuh"

namespace cuflash::detail::sm90 {

// Accumulator rows key_row and key_row + 8 (this thread's, wgmma.cuh's
// layout), n8 block i at 16-byte chunk chunk0 + i of the tile.
template <class KTile, typename T, int DT>
__device__ __forceinline__ void bwd_stage_dkdv(T* sK, T* sV, const float (&dk)[DT][4], const float (&dv)[DT][4],
                                               int key_row, int chunk0, float softmax_scale, int t4) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = key_row + 8 * half;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      *reinterpret_cast<std::uint32_t*>(sK + KTile::offset(r, chunk0 + i) + 2 * t4) =
          sm80::pack2<T>(dk[i][2 * half] * softmax_scale, dk[i][2 * half + 1] * softmax_scale);
      *reinterpret_cast<std::uint32_t*>(sV + KTile::offset(r, chunk0 + i) + 2 * t4) =
          sm80::pack2<T>(dv[i][2 * half], dv[i][2 * half + 1]);
    }
  }
}

// Rows [row0, row0 + rows) x chunks [chunk0, chunk0 + chunks) of the staged
// tiles, by the 128 threads of a warpgroup (`thread` = 0 .. 127): the keys
// of the sequence and the columns of the caller's head dim.
template <class KTile, typename T, int BN, int BM>
__device__ __forceinline__ void bwd_store_dkdv(const BackwardParams& p, const BwdKeyBlock<BN, BM>& blk, const T* sK,
                                               const T* sV, int row0, int rows, int chunk0, int chunks, int thread) {
  T* dk_base = static_cast<T*>(p.dk) + row_offset(p.dk_strides, blk.b, blk.seq.k_start, 0, blk.hk);
  T* dv_base = static_cast<T*>(p.dv) + row_offset(p.dv_strides, blk.b, blk.seq.k_start, 0, blk.hk);
  for (int idx = thread; idx < rows * chunks; idx += 128) {
    const int r = row0 + idx / chunks, c = chunk0 + idx % chunks;
    const int key = blk.n0 + r;
    if (key < blk.seq.k_len && c * 8 < p.head_dim) {
      *reinterpret_cast<uint4*>(dk_base + static_cast<std::int64_t>(key) * p.dk_strides.row + c * 8) =
          *reinterpret_cast<const uint4*>(sK + KTile::offset(r, c));
      *reinterpret_cast<uint4*>(dv_base + static_cast<std::int64_t>(key) * p.dv_strides.row + c * 8) =
          *reinterpret_cast<const uint4*>(sV + KTile::offset(r, c));
    }
  }
}

}  // namespace cuflash::detail::sm90
