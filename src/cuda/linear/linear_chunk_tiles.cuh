// The tile operations the chunked linear-attention kernels share: loading a
// 64-row tile into swizzled shared memory, applying the feature map there, and
// the two tensor-core products of a chunk (mma m16n8k16, fp32 accumulation):
//   state:  S[Dk x 64] += φKᵀ V      (A = φK transposed, B = V: both ldmatrix.trans)
//   scores: P[16 x 64]  = φQ φKᵀ     (A = φQ, B = φK: plain ldmatrix)
//   out:    O[16 x 64] += P V + φQ S (B = V or the bf16/f16 copy of S: ldmatrix.trans)
// A CTA is 4 warps; in the state product warp w owns rows [w Dk/4, (w+1) Dk/4)
// of S, in the others query rows [16 w, 16 w + 16) of the chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/swizzled_rows.hpp"
#include "common/tensor_core.cuh"
#include "linear/linear_params.hpp"

namespace cuflash::detail::linear {

constexpr int kChunk = 64;        // rows of one chunk
constexpr int kSlice = 64;        // value columns of one CTA
constexpr int kBlockChunks = 4;   // chunks of one block: a state is kept per block of rows
constexpr int kBlockRows = kChunk * kBlockChunks;
constexpr int kChunkWarps = 4;
constexpr int kChunkThreads = 32 * kChunkWarps;

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }

// Element (row, col) of a swizzled tile of D-element rows.
template <int D>
__device__ __forceinline__ int tile_index(int row, int col) {
  return SwizzledRows<D>::offset(row, col / 8) + col % 8;
}

// Rows [0, count) of a 64-row tile from global memory (row r at base + r *
// row_stride, columns [0, D)); rows >= count are zero-filled. cp.async, committed.
template <int D, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, std::int64_t row_stride, int count) {
  constexpr int kChunksPerRow = D / 8;
  for (int c = threadIdx.x; c < kChunk * kChunksPerRow; c += kChunkThreads) {
    const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
    const bool valid = row < count;
    const T* src = valid ? base + row * row_stride + chunk * 8 : base;
    sm80::cp_async_16(tile + SwizzledRows<D>::offset(row, chunk), src, valid);
  }
  sm80::cp_async_commit();
}

// tile := multiplier · φ(tile) in place for rows < count, 0 for the others
// (φ(0) is 1 for elu+1: padding rows must not join the sums). No barrier.
template <int D, typename T>
__device__ __forceinline__ void apply_feature_map(T* tile, Map map, float multiplier, int count) {
  for (int e = threadIdx.x; e < kChunk * D; e += kChunkThreads) {
    const int row = e / D, col = e % D;
    const int at = tile_index<D>(row, col);
    const float x = row < count ? multiplier * feature(map, to_float(tile[at])) : 0.0f;
    tile[at] = from_float<T>(x);
  }
}

// acc[m][n] (Dk/64 m-tiles of 16 rows, 8 n-tiles of 8 columns) += φKᵀ V for warp w's rows of S.
// k_tile: [64][Dk] swizzled; v_tile: [64][64] swizzled.
template <int DK, typename T>
__device__ __forceinline__ void accumulate_state(float (&acc)[DK / 64][8][4], const T* k_tile, const T* v_tile) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
    std::uint32_t a[DK / 64][4];
#pragma unroll
    for (int mt = 0; mt < DK / 64; ++mt) {
      const int m0 = warp * (DK / 4) + mt * 16;
      sm80::ldmatrix_x4_trans(a[mt], k_tile + tile_index<DK>(kk * 16 + (quad / 2) * 8 + r, m0 + (quad % 2) * 8));
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      std::uint32_t b[4];
      sm80::ldmatrix_x4_trans(b, v_tile + tile_index<kSlice>(kk * 16 + (quad % 2) * 8 + r, np * 16 + (quad / 2) * 8));
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < DK / 64; ++mt) {
        sm80::mma_16816<T>(acc[mt][2 * np], a[mt], b0);
        sm80::mma_16816<T>(acc[mt][2 * np + 1], a[mt], b1);
      }
    }
  }
}

// Row and column of accumulator element e (0..3) of n-tile nt in m-tile mt of warp w's state rows.
template <int DK>
__device__ __forceinline__ int state_row(int mt, int e) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  return warp * (DK / 4) + mt * 16 + lane / 4 + (e >= 2 ? 8 : 0);
}
__device__ __forceinline__ int acc_col(int nt, int e) { return nt * 8 + 2 * (threadIdx.x % 4) + (e & 1); }

// The 16-bit copy of S the out product reads: [Dk][64] swizzled. No barrier.
template <int DK, typename T>
__device__ __forceinline__ void store_state_copy(const float (&acc)[DK / 64][8][4], T* s_tile) {
#pragma unroll
  for (int mt = 0; mt < DK / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = state_row<DK>(mt, 2 * half), col = acc_col(nt, 0);
        *reinterpret_cast<std::uint32_t*>(s_tile + tile_index<kSlice>(row, col)) =
            sm80::pack2<T>(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
      }
}

// A fragment of φQ (warp w's 16 rows, k-tile kt) from q_tile [64][Dk] swizzled.
template <int DK, typename T>
__device__ __forceinline__ void load_query_fragment(std::uint32_t (&a)[4], const T* q_tile, int kt) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
  sm80::ldmatrix_x4(a, q_tile + tile_index<DK>(warp * 16 + (quad % 2) * 8 + r, kt * 16 + (quad / 2) * 8));
}

// scores[nt] = φQ φKᵀ for warp w's 16 rows and key n-tiles [0, 2 * tiles).
template <int DK, typename T>
__device__ __forceinline__ void chunk_scores(float (&scores)[8][4], const T* q_tile, const T* k_tile, int tiles) {
  const int lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) scores[nt][e] = 0.0f;
#pragma unroll
  for (int kt = 0; kt < DK / 16; ++kt) {
    std::uint32_t a[4];
    load_query_fragment<DK>(a, q_tile, kt);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (np >= tiles) break;
      std::uint32_t b[4];
      sm80::ldmatrix_x4(b, k_tile + tile_index<DK>(np * 16 + (quad / 2) * 8 + r, kt * 16 + (quad % 2) * 8));
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      sm80::mma_16816<T>(scores[2 * np], a, b0);
      sm80::mma_16816<T>(scores[2 * np + 1], a, b1);
    }
  }
}

// out += A B over k-tiles [0, k_tiles) (k_tiles <= kMaxTiles, unrolled so that
// a_of may index register arrays by kt), A 16 x 16k from `a_of(kt, a)`, B from a
// [16 k_tiles][64] swizzled tile (V or the copy of S) through ldmatrix.trans.
template <int kMaxTiles, typename T, typename AFragment>
__device__ __forceinline__ void accumulate_out(float (&out)[8][4], const T* b_tile, int k_tiles, AFragment a_of) {
  const int lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
#pragma unroll
  for (int kt = 0; kt < kMaxTiles; ++kt) {
    if (kt >= k_tiles) break;
    std::uint32_t a[4];
    a_of(kt, a);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      std::uint32_t b[4];
      sm80::ldmatrix_x4_trans(b, b_tile + tile_index<kSlice>(kt * 16 + (quad % 2) * 8 + r, np * 16 + (quad / 2) * 8));
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      sm80::mma_16816<T>(out[2 * np], a, b0);
      sm80::mma_16816<T>(out[2 * np + 1], a, b1);
    }
  }
}

}  // namespace cuflash::detail::linear
