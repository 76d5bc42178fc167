// The tile operations the chunked linear-attention kernels share: loading a
// 64-row tile into swizzled shared memory, transforming it there (feature
// map, scale, 1/normalizer), and the tensor-core products (mma m16n8k16,
// fp32 accumulation) of the per-chunk pass (linear_chunk_pass.cuh,
// out = A S' + mask(A Bᵀ) Vt; the state walk's own product is in
// linear_chunk_state.cuh):
//   scores: P[16 x 64]  = A Bᵀ           (plain ldmatrix; also A S'ᵀ when S' is stored transposed)
//   out:    O[16 x 64] += P Vt + A S'    (B = Vt or the 16-bit S': ldmatrix.trans)
// A pass CTA is 4 warps, warp w on rows [16 w, 16 w + 16) of the chunk.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/swizzled_rows.hpp"
#include "common/tensor_core.cuh"
#include "linear/linear_params.hpp"
#include "linear/linear_walk_segments.hpp"

namespace cuflash::detail::linear {

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

// Two 16-bit values of one register (lo first) as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(std::uint32_t bits) {
  T pair[2];
  static_assert(sizeof(pair) == sizeof(bits));
  __builtin_memcpy(pair, &bits, sizeof(bits));
  return make_float2(to_float(pair[0]), to_float(pair[1]));
}

// Rows [0, count) of a 64-row tile from global memory (row r at base + r *
// row_stride, columns [0, D)); rows >= count are zero-filled. cp.async, not
// committed: the caller commits a stage's loads as one group.
// kThreads: the CTA's threads, which share the work.
template <int D, int kThreads = kChunkThreads, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const T* base, std::int64_t row_stride, int count) {
  constexpr int kChunksPerRow = D / 8;
  static_assert(kChunk * kChunksPerRow % kThreads == 0, "every thread the same count of 16-byte chunks");
  // A trip count known at compile time (not `c = threadIdx.x; c < n; c += kThreads`,
  // which nvcc keeps as a loop with a remainder): the walk's step is a chain, and
  // the loop's overhead was a good part of its instructions.
#pragma unroll
  for (int i = 0; i < kChunk * kChunksPerRow / kThreads; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
    const bool valid = row < count;
    const T* src = valid ? base + row * row_stride + chunk * 8 : base;
    sm80::cp_async_16(tile + SwizzledRows<D>::offset(row, chunk), src, valid);
  }
}

// tile[row][col] := f(row, tile[row][col]) for every element of a 64-row tile,
// 16 bytes per step. The swizzle permutes 16-byte chunks within a row only, so
// the storage order visits whole rows in order. No barrier.
template <int D, int kThreads = kChunkThreads, typename T, typename F>
__device__ __forceinline__ void transform_tile(T* tile, F f) {
  static_assert(SwizzledRows<D>::kPitch == D, "rows stored back to back");
  constexpr int kChunksPerRow = D / 8;
  static_assert(kChunk * kChunksPerRow % kThreads == 0, "every thread the same count of 16-byte chunks");
#pragma unroll
  for (int i = 0; i < kChunk * kChunksPerRow / kThreads; ++i) {  // a compile-time trip count (load_tile_async)
    const int c = threadIdx.x + i * kThreads;
    const int row = c / kChunksPerRow;
    alignas(16) T elements[8];
    *reinterpret_cast<uint4*>(elements) = *reinterpret_cast<const uint4*>(tile + c * 8);
#pragma unroll
    for (int e = 0; e < 8; ++e) elements[e] = from_float<T>(f(row, to_float(elements[e])));
    *reinterpret_cast<uint4*>(tile + c * 8) = *reinterpret_cast<const uint4*>(elements);
  }
}

// Column of accumulator element e (0..3) of n-tile nt.
__device__ __forceinline__ int acc_col(int nt, int e) { return nt * 8 + 2 * (threadIdx.x % 4) + (e & 1); }
// Chunk row of accumulator element e of the warp's 16 rows (out, scores).
__device__ __forceinline__ int chunk_row(int e) { return (threadIdx.x / 32) * 16 + (threadIdx.x % 32) / 4 + (e >= 2 ? 8 : 0); }

// A fragment of A (warp w's 16 rows, k-tile kt) from a_tile [64][DR] swizzled.
template <int DR, typename T>
__device__ __forceinline__ void load_row_fragment(std::uint32_t (&a)[4], const T* a_tile, int kt) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
  sm80::ldmatrix_x4(a, a_tile + tile_index<DR>(warp * 16 + (quad % 2) * 8 + r, kt * 16 + (quad / 2) * 8));
}

// acc[nt] += A Bᵀ for warp w's 16 rows and the columns of n-tile pairs
// [first_pair, last_pair) (16 columns each; B [64][DR] swizzled, its rows the
// columns of the product); the other n-tiles are left alone.
template <int DR, typename T>
__device__ __forceinline__ void accumulate_row_products(float (&acc)[8][4], const T* a_tile, const T* b_tile,
                                                        int first_pair, int last_pair) {
  const int lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
#pragma unroll
  for (int kt = 0; kt < DR / 16; ++kt) {
    std::uint32_t a[4];
    load_row_fragment<DR>(a, a_tile, kt);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      if (np < first_pair || np >= last_pair) continue;
      std::uint32_t b[4];
      sm80::ldmatrix_x4(b, b_tile + tile_index<DR>(np * 16 + (quad / 2) * 8 + r, kt * 16 + (quad % 2) * 8));
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      sm80::mma_16816<T>(acc[2 * np], a, b0);
      sm80::mma_16816<T>(acc[2 * np + 1], a, b1);
    }
  }
}

// scores = A Bᵀ over n-tile pairs [first_pair, last_pair), 0 elsewhere.
template <int DR, typename T>
__device__ __forceinline__ void chunk_scores(float (&scores)[8][4], const T* a_tile, const T* b_tile, int first_pair,
                                             int last_pair) {
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) scores[nt][e] = 0.0f;
  accumulate_row_products<DR>(scores, a_tile, b_tile, first_pair, last_pair);
}

// Two n8 fragments of B, columns [n0, n0 + 8) and [n0 + 8, n0 + 16) of k-tile
// kt of a [16 k-tiles][64] swizzled tile (Vt or S'), through ldmatrix.trans:
// (b[0], b[1]) and (b[2], b[3]).
template <typename T>
__device__ __forceinline__ void load_trans_b_pair(std::uint32_t (&b)[4], const T* tile, int kt, int n0) {
  const int lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
  sm80::ldmatrix_x4_trans(b, tile + tile_index<kSlice>(kt * 16 + (quad % 2) * 8 + r, n0 + (quad / 2) * 8));
}

// out += A B over k-tiles [first, last) (within [0, kMaxTiles), unrolled so
// that a_of may index register arrays by kt), A 16 x 16 per k-tile from
// `a_of(kt, a)`, B from a [16 kMaxTiles][64] swizzled tile (Vt or S')
// through ldmatrix.trans.
template <int kMaxTiles, typename T, typename AFragment>
__device__ __forceinline__ void accumulate_out(float (&out)[8][4], const T* b_tile, int first, int last,
                                               AFragment a_of) {
#pragma unroll
  for (int kt = 0; kt < kMaxTiles; ++kt) {
    if (kt < first || kt >= last) continue;
    std::uint32_t a[4];
    a_of(kt, a);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      std::uint32_t b[4];
      load_trans_b_pair(b, b_tile, kt, np * 16);
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      sm80::mma_16816<T>(out[2 * np], a, b0);
      sm80::mma_16816<T>(out[2 * np + 1], a, b1);
    }
  }
}

// A state's products over one chunk (the walk's and the fused forward's):
// acc[mt * kColTiles + nt] += (b_multiplier B)ᵀ Vt for Bᵀ's rows
// [m0 + 16 mt, + 16) (columns of the [64][W] tile b_tile) and Vt's columns
// [n0 + 8 nt, + 8) (of the [64][64] tile vt_tile), summed over the chunk's
// 64 rows. The multiplier goes into B's 16-bit fragments, rounded once as
// the tile's transform would have rounded it.
template <int kRowTiles, int kColTiles, int W, typename T>
__device__ __forceinline__ void accumulate_transposed_products(float (&acc)[kRowTiles * kColTiles][4],
                                                               const T* b_tile, const T* vt_tile, int m0, int n0,
                                                               float b_multiplier) {
  static_assert(kColTiles % 2 == 0, "Vt's fragments come in pairs");
  const int lane = threadIdx.x % 32;
  const int quad = lane / 8, r = lane % 8;
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
    std::uint32_t a[kRowTiles][4];
#pragma unroll
    for (int mt = 0; mt < kRowTiles; ++mt) {
      sm80::ldmatrix_x4_trans(a[mt], b_tile + tile_index<W>(kk * 16 + (quad / 2) * 8 + r, m0 + mt * 16 + (quad % 2) * 8));
      if (b_multiplier != 1.0f)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float2 pair = unpack2<T>(a[mt][i]);
          a[mt][i] = sm80::pack2<T>(b_multiplier * pair.x, b_multiplier * pair.y);
        }
    }
#pragma unroll
    for (int np = 0; np < kColTiles / 2; ++np) {
      std::uint32_t b[4];
      load_trans_b_pair(b, vt_tile, kk, n0 + np * 16);
      const std::uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < kRowTiles; ++mt) {
        sm80::mma_16816<T>(acc[mt * kColTiles + 2 * np], a[mt], b0);
        sm80::mma_16816<T>(acc[mt * kColTiles + 2 * np + 1], a[mt], b1);
      }
    }
  }
}

}  // namespace cuflash::detail::linear
