// FlashAttention-2 forward on mma.sync (sm80+; the same code runs on sm90).
//
// One CTA computes BM query rows of one (batch, head) against the key tiles
// they can see (or against one split's share of them). Each of the NW warps
// owns 16*MT consecutive rows, so the online softmax needs no cross-warp
// communication: a row's max and sum live in the four lanes of a quad.
// Pipeline (single K and V buffers, as in FlashAttention-2): V_t loads while
// S = Q K_t^T is computed, K_{t+1} loads while O += P V_t is computed.
// Shared-memory rows are padded by 8 elements (16 bytes), which makes every
// ldmatrix phase conflict-free for all supported head dims.
#pragma once

#include <cmath>

#include "common/attention_params.hpp"
#include "common/dropout.cuh"
#include "common/forward_block.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm80/head_dims.hpp"

namespace cuflash::detail::sm80 {

template <typename T, int D_, int BM_, int BN_, int NW_, bool QInRegs_, int MinBlocks_>
struct FwdConfig {
  using Element = T;
  static constexpr int D = D_, BM = BM_, BN = BN_, NW = NW_, kThreads = NW * 32;
  static constexpr bool QInRegs = QInRegs_;
  static constexpr int MinBlocks = MinBlocks_;
  static constexpr int MT = BM / (16 * NW);  // m16 tiles per warp
  static constexpr int NT = BN / 8;          // n8 tiles of S per warp
  static constexpr int DT = D / 8;           // n8 tiles of O per warp
  static constexpr int KQ = D / 16;          // k-steps of Q K^T
  static constexpr int KP = BN / 16;         // k-steps of P V
  static constexpr int kRow = D + 8;         // padded shared-memory row, elements
  static constexpr int kSmemBytes = (BM + 2 * BN) * kRow * static_cast<int>(sizeof(T));
  static_assert(BM % (16 * NW) == 0 && MT >= 1, "rows per warp must be a multiple of 16");
  static_assert(D % 16 == 0 && BN % 16 == 0, "tiles must be multiples of 16");
};

// ROWS x D tile of global rows [row0, row0+ROWS) -> shared memory; rows at or
// past `valid_rows` are zero-filled (never read). Columns at or past `cols`
// (the caller's head dim, a multiple of 8 up to D): zero-filled for Q
// (kZeroPastCols); for K and V a copy of the row's first columns: the rule
// of sm80::chunk_to_read (head_dims.hpp), written out here in element offsets
// (`col_inside ? c * 8 : 0`), the form this kernel was measured with.
// Where it can, each thread copies one
// fixed 16-byte column of every (kThreads / chunks-per-row)-th row, so its
// address advances by a constant: one 64-bit multiply per tile, not per chunk.
template <class C, int ROWS, bool kZeroPastCols>
__device__ __forceinline__ void load_tile(typename C::Element* smem, const typename C::Element* global,
                                          std::int64_t row_stride, int row0, int valid_rows, int cols) {
  constexpr int kChunksPerRow = C::D / 8;
  if constexpr (C::kThreads % kChunksPerRow == 0) {
    constexpr int kRowStep = C::kThreads / kChunksPerRow;
    constexpr int kIters = (ROWS + kRowStep - 1) / kRowStep;
    const int r = threadIdx.x / kChunksPerRow, c = threadIdx.x % kChunksPerRow;
    const bool col_inside = c * 8 < cols;
    const typename C::Element* src = global + (row0 + r) * row_stride + (col_inside ? c * 8 : 0);
    typename C::Element* dst = smem + r * C::kRow + c * 8;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      if (ROWS % kRowStep == 0 || r + it * kRowStep < ROWS) {
        const bool valid = (!kZeroPastCols || col_inside) && row0 + r + it * kRowStep < valid_rows;
        cp_async_16(dst + it * kRowStep * C::kRow, valid ? src : global, valid);
      }
      src += kRowStep * row_stride;
    }
  } else {  // head dims 96, 192: a thread's column changes from chunk to chunk
    constexpr int kChunks = ROWS * kChunksPerRow;
#pragma unroll
    for (int idx = threadIdx.x; idx < kChunks; idx += C::kThreads) {
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const bool col_inside = c * 8 < cols;
      const bool valid = row0 + r < valid_rows && (!kZeroPastCols || col_inside);
      const int col = col_inside ? c * 8 : 0;
      cp_async_16(smem + r * C::kRow + c * 8, valid ? global + (row0 + r) * row_stride + col : global, valid);
    }
  }
}

// Whether 16 columns from `col0` hold any of the caller's head_dim columns, in
// the kernel that skips the zero columns of a narrower head dim (`Narrow`).
// Columns below the smallest head dim this kernel serves always do, so only
// the last steps of a tile pay the test. The runtime test costs registers
// (the D=96 kernel spilled 20-48 bytes more with it), so the kernels for
// head dims that are the kernel's own do not have it.
template <class C, bool Narrow>
__device__ __forceinline__ bool columns_used(int col0, int head_dim) {
  if constexpr (!Narrow) return true;
  return col0 < min_head_dim_served(C::D) || col0 < head_dim;
}

// Transformed: softcap or ALiBi is on, so every score goes through
// ScoreRules::logit2 (a separate instantiation keeps that code and its
// registers out of the plain kernel). Dropout: p.dropout's mask zeroes
// probabilities after the row sums (instantiated with Transformed only:
// logit2 computes plain scores too, and one more variant per tile is build
// time that the Philox work would hide anyway). Narrow: p.head_dim < D, and
// the GEMM steps over columns past it are skipped (instantiated for the
// plain kernel only; the others compute on the zero columns).
template <class C, bool Transformed, bool Dropout = false, bool Narrow = false>
__global__ void __launch_bounds__(C::kThreads, C::MinBlocks)
    flash_fwd_kernel(const ForwardParams p, const ForwardBlockDivisors divisors) {
  using T = typename C::Element;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + C::BM * C::kRow;
  T* sV = sK + C::BN * C::kRow;

  const ForwardBlock f = forward_block<C::BM, C::BN>(p, divisors);
  if (!f.active) return;
  const SeqBounds& seq = f.seq;
  const ScoreRules& rules = f.rules;
  const int b = f.b, h = f.h, hk = f.hk, m0 = f.m0, rows_here = f.rows, t_lo = f.t_lo, t_hi = f.t_hi;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int warp_row0 = warp * 16 * C::MT;  // within the block

  float o[C::MT][C::DT][4];
  float row_max[C::MT][2], row_sum[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  // Multiplier from the (possibly transformed) score to a base-2 logit.
  const float mult = Transformed ? 1.0f : rules.scale_log2;
  const DropoutHead drop = Dropout ? dropout_head(p, b, h) : DropoutHead{};

  if (t_lo < t_hi) {
    const T* q_base = static_cast<const T*>(p.q) + row_offset(p.q_strides, b, seq.q_start, 0, h);
    const T* k_base = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_start, 0, hk);
    const T* v_base = static_cast<const T*>(p.v) + row_offset(p.v_strides, b, seq.k_start, 0, hk);

    load_tile<C, C::BM, true>(sQ, q_base, p.q_strides.row, m0, seq.q_len, p.head_dim);
    cp_async_commit();
    // Key tiles from the last to the first: the tiles needing a mask (the
    // causal diagonal, the end of the sequence) come first.
    load_tile<C, C::BN, false>(sK, k_base, p.k_strides.row, (t_hi - 1) * C::BN, seq.k_len, p.head_dim);
    cp_async_commit();
    // The first V tile streams in while the first S is computed.
    load_tile<C, C::BN, false>(sV, v_base, p.v_strides.row, (t_hi - 1) * C::BN, seq.k_len, p.head_dim);
    cp_async_commit();

    std::uint32_t qf[C::QInRegs ? C::MT : 1][C::QInRegs ? C::KQ : 1][4];

    for (int tile = t_hi - 1; tile >= t_lo; --tile) {
      const int n0 = tile * C::BN;
      const bool first_tile = tile == t_hi - 1;
      if (first_tile) {
        cp_async_wait<1>();  // Q and K; V may still be in flight
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // K_tile (and Q) visible to all warps
      if constexpr (C::QInRegs) {
        if (first_tile) {
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
            for (int ks = 0; ks < C::KQ; ++ks)
              ldmatrix_x4(qf[mt][ks], sQ + (warp_row0 + mt * 16 + (lane % 16)) * C::kRow + ks * 16 + (lane / 16) * 8);
        }
      }
      if (!first_tile) {
        load_tile<C, C::BN, false>(sV, v_base, p.v_strides.row, n0, seq.k_len, p.head_dim);
        cp_async_commit();
      }

      // S = Q K^T
      float s[C::MT][C::NT][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks) {
        if (!columns_used<C, Narrow>(ks * 16, p.head_dim)) break;  // zero columns of a narrower head dim
        std::uint32_t qa[C::MT][4];
        if constexpr (!C::QInRegs) {
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt)
            ldmatrix_x4(qa[mt], sQ + (warp_row0 + mt * 16 + (lane % 16)) * C::kRow + ks * 16 + (lane / 16) * 8);
        }
#pragma unroll
        for (int np = 0; np < C::NT / 2; ++np) {
          std::uint32_t kb[4];
          ldmatrix_x4(kb, sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * C::kRow + ks * 16 + ((lane / 8) % 2) * 8);
          const std::uint32_t b0[2] = {kb[0], kb[1]};
          const std::uint32_t b1[2] = {kb[2], kb[3]};
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt) {
            if constexpr (C::QInRegs) {
              mma_16816<T>(s[mt][2 * np], qf[mt][ks], b0);
              mma_16816<T>(s[mt][2 * np + 1], qf[mt][ks], b1);
            } else {
              mma_16816<T>(s[mt][2 * np], qa[mt], b0);
              mma_16816<T>(s[mt][2 * np + 1], qa[mt], b1);
            }
          }
        }
      }

      // Scores -> (masked) logits; online softmax.
      const bool masked = !rules.tile_unmasked(m0, rows_here, n0, C::BN);
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) {
        float correction[2];
        online_softmax_m16<C::NT, Transformed, RunningMax::exact>(s[mt], row_max[mt], row_sum[mt], correction,
                                                                  rules, m0 + warp_row0 + mt * 16 + g, n0, masked,
                                                                  t4, mult);
        if constexpr (Dropout)
          drop_probabilities_m16<C::NT>(s[mt], drop, m0 + warp_row0 + mt * 16 + g, n0, t4);
        rescale_rows_m16<C::DT>(o[mt], correction);
      }

      cp_async_wait<0>();
      __syncthreads();  // V_tile visible; every warp is done with K_tile
      if (tile > t_lo) {
        load_tile<C, C::BN, false>(sK, k_base, p.k_strides.row, n0 - C::BN, seq.k_len, p.head_dim);
        cp_async_commit();
      }

      // O += P V, P straight from the S accumulators.
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk) {
        std::uint32_t pa[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < C::DT / 2; ++dp) {
          if (!columns_used<C, Narrow>(dp * 16, p.head_dim)) break;  // output columns nobody stores
          std::uint32_t vb[4];
          ldmatrix_x4_trans(vb, sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * C::kRow + dp * 16 + (lane / 16) * 8);
          const std::uint32_t b0[2] = {vb[0], vb[1]};
          const std::uint32_t b1[2] = {vb[2], vb[3]};
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt) {
            mma_16816<T>(o[mt][2 * dp], pa[mt], b0);
            mma_16816<T>(o[mt][2 * dp + 1], pa[mt], b1);
          }
        }
      }
    }
  }

  // Epilogue: normalize, write out (or this split's partial) and lse. The
  // output goes through this warp's own rows of sQ (no other warp reads
  // them), so global stores are whole 16-byte row chunks.
  float inv_sum[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
  {
    finish_rows_m16(p, f, row_max[mt], row_sum[mt], mult, m0 + warp_row0 + mt * 16 + g, t4, inv_sum[mt]);
    if constexpr (Dropout) {
      inv_sum[mt][0] *= p.dropout_keep_scale;
      inv_sum[mt][1] *= p.dropout_keep_scale;
    }
  }
  if (p.num_splits > 1) {
#pragma unroll
    for (int mt = 0; mt < C::MT; ++mt) write_partial_m16<C::D>(p, f, o[mt], inv_sum[mt], m0 + warp_row0 + mt * 16 + g, t4);
    return;
  }
  // This warp is the only reader of its sQ rows, and it finished reading them
  // before the last P V (tiles were loaded by all threads, but a warp's Q rows
  // are consumed by that warp alone); the __syncwarp orders its lanes.
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      T* srow = sQ + (warp_row0 + mt * 16 + g + half * 8) * C::kRow;
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt)
        *reinterpret_cast<std::uint32_t*>(srow + dt * 8 + 2 * t4) =
            pack2<T>(o[mt][dt][half * 2] * inv_sum[mt][half], o[mt][dt][half * 2 + 1] * inv_sum[mt][half]);
    }
  __syncwarp();
  T* out_base = static_cast<T*>(p.out) + row_offset(p.out_strides, b, seq.q_start, 0, h);
  constexpr int kChunksPerRow = C::D / 8;
  constexpr int kWarpRows = 16 * C::MT;
#pragma unroll
  for (int idx = lane; idx < kWarpRows * kChunksPerRow; idx += 32) {
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    const int i = m0 + warp_row0 + r;
    if (i < seq.q_len && c * 8 < p.head_dim)
      *reinterpret_cast<uint4*>(out_base + static_cast<std::int64_t>(i) * p.out_strides.row + c * 8) =
          *reinterpret_cast<const uint4*>(sQ + (warp_row0 + r) * C::kRow + c * 8);
  }
}

}  // namespace cuflash::detail::sm80
