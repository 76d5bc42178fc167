// FlashAttention-2 backward kernels (fp16/bf16, mma.sync m16n8k16, sm80+),
// templated on the element type T and the head dim D:
//
//   flash_bwd_dsum_kernel     dsum[h][row] = dot(dout_row, out_row), fp32; zeroes
//                             dq_accum for the atomics (not deterministic)
//   flash_bwd_dkdv_kernel     one CTA per (key block, kv head, batch): K, V stay
//                             in shared memory while the CTA walks every query
//                             head of the GQA group and every query block that
//                             sees the keys; dK, dV accumulate in registers
//                             (so the group reduction is free and deterministic);
//                             dQ tiles go to the fp32 dq_accum with atomics
//                             unless the call is deterministic
//   flash_bwd_convert_dq_kernel  dq = softmax_scale * dq_accum, as T
//   flash_bwd_dq_kernel       deterministic dQ: one CTA per (query block, head,
//                             batch) recomputes S, dP, dS over its key blocks
//
// Per tile (BM query rows x BN keys), with P = exp2(logit2 - lse * log2 e):
//   S = Q K^T, dP = dO V^T, dS = P * (dP - dsum) [* (1 - tanh^2) with softcap]
//   dV += P^T dO, dK += dS^T Q, dQ += dS K
// (with dropout, Z = mask / (1 - p): dS = P * (Z dP - dsum), dV += (Z P)^T dO)
// P and dS are written to shared memory as T (the A operands of P^T dO and
// dS^T Q are read back with ldmatrix.trans). Every shared tile row holds
// D + 8 (or BN + 8) elements, which makes all ldmatrix accesses conflict-free.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/dropout.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"

namespace cuflash::detail::sm80 {

// ---------------------------------------------------------------------------
// Tiles. Warp grids (8 warps) of the three GEMM shapes:
//   S, dP   [BM x BN]: kWarpsMS x kWarpsNS
//   dK, dV  [BN x D]:  kWarpsNKV x kWarpsDKV
//   dQ      [BM x D]:  kWarpsMQ x kWarpsDQ
// ---------------------------------------------------------------------------
// 128x128 tiles up to D=64, then 64-row query blocks (D=96, 128) and 64-key
// blocks (D=192, 256) as D grows, to stay within one CTA's registers (255 per
// thread) and shared memory. The warp grids follow the tile: S/dP turns 4x2
// with 64-key blocks, and dQ spreads its warps over D from D=128.
template <int D>
struct FlashBwdTile {
  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 192 || D == 256, "head dims of sm80/head_dims.hpp");
  static constexpr int kBlockM = D <= 64 ? 128 : 64, kBlockN = D <= 128 ? 128 : 64;
  static constexpr int kWarpsMS = kBlockN == 128 ? 2 : 4, kWarpsNS = 8 / kWarpsMS;
  static constexpr int kWarpsNKV = kBlockN == 128 ? 4 : 2, kWarpsDKV = 8 / kWarpsNKV;
  static constexpr int kWarpsMQ = D <= 96 ? 4 : 2, kWarpsDQ = 8 / kWarpsMQ;
};

template <int D>
struct FlashBwdTraits {
  using Tile = FlashBwdTile<D>;
  static constexpr int kThreads = 256;
  static constexpr int BM = Tile::kBlockM;
  static constexpr int BN = Tile::kBlockN;
  static constexpr int kLd = D + 8;    // shared row of Q, dO, K, V (elements)
  static constexpr int kLdS = BN + 8;  // shared row of P, dS

  static constexpr int kRowsS = BM / Tile::kWarpsMS, kColsS = BN / Tile::kWarpsNS;
  static constexpr int kMTS = kRowsS / 16, kNTS = kColsS / 8;
  static constexpr int kRowsKV = BN / Tile::kWarpsNKV, kColsKV = D / Tile::kWarpsDKV;
  static constexpr int kMTKV = kRowsKV / 16, kNTKV = kColsKV / 8;
  static constexpr int kRowsQ = BM / Tile::kWarpsMQ, kColsQ = D / Tile::kWarpsDQ;
  static constexpr int kMTQ = kRowsQ / 16, kNTQ = kColsQ / 8;
  // The main kernel's dQ GEMM runs in this many column slices per warp.
  static constexpr int kDqPasses = D == 256 ? 2 : 1;
  static_assert(kNTQ % (2 * kDqPasses) == 0);

  static_assert(Tile::kWarpsMS * Tile::kWarpsNS == 8 && Tile::kWarpsNKV * Tile::kWarpsDKV == 8 &&
                Tile::kWarpsMQ * Tile::kWarpsDQ == 8);
  static_assert(kRowsS % 16 == 0 && kColsS % 16 == 0 && kRowsKV % 16 == 0 && kColsKV % 16 == 0 &&
                kRowsQ % 16 == 0 && kColsQ % 16 == 0 && D % 16 == 0);

  // Main kernel: K, V [BN][kLd]; Q, dO [stages][BM][kLd]; P, dS [BM][kLdS];
  // raw lse and dsum [2][BM] floats.
  static constexpr std::size_t main_smem_bytes(int stages) {
    return 2 * (2 * static_cast<std::size_t>(BN) * kLd + 2 * static_cast<std::size_t>(stages) * BM * kLd +
                2 * static_cast<std::size_t>(BM) * kLdS) +
           4 * 4 * static_cast<std::size_t>(BM);
  }
  // Deterministic dQ kernel: Q, dO [BM][kLd]; K, V [stages][BN][kLd];
  // dS [BM][kLdS]; raw lse and dsum [BM] floats.
  static constexpr std::size_t dq_smem_bytes(int stages) {
    return 2 * (2 * static_cast<std::size_t>(BM) * kLd + 2 * static_cast<std::size_t>(stages) * BN * kLd +
                static_cast<std::size_t>(BM) * kLdS) +
           2 * 4 * static_cast<std::size_t>(BM);
  }
};

namespace bwd {

// ---------------------------------------------------------------------------
// Fragment loads (see tensor_core.cuh for the layouts). `ld` in elements.
// ---------------------------------------------------------------------------

// A 16x16 at (m0, k0) of a row-major [m][k] tile.
template <typename T>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const T* base, int ld, int m0, int k0, int lane) {
  ldmatrix_x4(a, base + (m0 + (lane & 15)) * ld + k0 + ((lane >> 4) << 3));
}
// A 16x16 at (m0, k0) of a tile stored transposed, [k][m].
template <typename T>
__device__ __forceinline__ void load_a_trans(std::uint32_t (&a)[4], const T* base, int ld, int m0, int k0, int lane) {
  ldmatrix_x4_trans(a, base + (k0 + (lane & 7) + ((lane >> 4) << 3)) * ld + m0 + (((lane >> 3) & 1) << 3));
}
// B of two n-tiles (n0..n0+7: r[0], r[1]; n0+8..n0+15: r[2], r[3]) at k0 of a
// tile stored [n][k].
template <typename T>
__device__ __forceinline__ void load_b_nk(std::uint32_t (&r)[4], const T* base, int ld, int n0, int k0, int lane) {
  ldmatrix_x4(r, base + (n0 + (lane & 7) + ((lane >> 4) << 3)) * ld + k0 + (((lane >> 3) & 1) << 3));
}
// The same from a tile stored [k][n].
template <typename T>
__device__ __forceinline__ void load_b_kn(std::uint32_t (&r)[4], const T* base, int ld, int n0, int k0, int lane) {
  ldmatrix_x4_trans(r, base + (k0 + (lane & 7) + (((lane >> 3) & 1) << 3)) * ld + n0 + ((lane >> 4) << 3));
}

// A and B fragments of one k-step.
template <typename T, int MT, int NT, bool kATrans, bool kBKn>
__device__ __forceinline__ void load_step(std::uint32_t (&af)[MT][4], std::uint32_t (&bf)[NT][2], const T* a,
                                          int lda, int am0, const T* b, int ldb, int bn0, int ks, int lane) {
  static_assert(NT % 2 == 0, "B fragments are loaded two n-tiles at a time");
#pragma unroll
  for (int mi = 0; mi < MT; ++mi) {
    if constexpr (kATrans) load_a_trans(af[mi], a, lda, am0 + mi * 16, ks * 16, lane);
    else load_a(af[mi], a, lda, am0 + mi * 16, ks * 16, lane);
  }
#pragma unroll
  for (int nj = 0; nj < NT / 2; ++nj) {
    std::uint32_t r[4];
    if constexpr (kBKn) load_b_kn(r, b, ldb, bn0 + nj * 16, ks * 16, lane);
    else load_b_nk(r, b, ldb, bn0 + nj * 16, ks * 16, lane);
    bf[2 * nj][0] = r[0];
    bf[2 * nj][1] = r[1];
    bf[2 * nj + 1][0] = r[2];
    bf[2 * nj + 1][1] = r[3];
  }
}

template <typename T, int MT, int NT>
__device__ __forceinline__ void mma_step(float (&acc)[MT][NT][4], const std::uint32_t (&af)[MT][4],
                                         const std::uint32_t (&bf)[NT][2]) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni) mma_16816<T>(acc[mi][ni], af[mi], bf[ni]);
}

// acc[MT][NT] += A[am0 .. am0 + 16 MT, 0 .. 16 KSTEPS] * B[.., bn0 .. bn0 + 8 NT].
// kATrans: A is stored [k][m]; kBKn: B is stored [k][n] (else [n][k]).
template <typename T, int MT, int NT, int KSTEPS, bool kATrans, bool kBKn>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const T* a, int lda, int am0, const T* b, int ldb,
                                          int bn0, int lane) {
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    std::uint32_t af[MT][4];
    std::uint32_t bf[NT][2];
    load_step<T, MT, NT, kATrans, kBKn>(af, bf, a, lda, am0, b, ldb, bn0, ks, lane);
    mma_step<T>(acc, af, bf);
  }
}

// The same with step_work(ks) (global reductions) between k-steps, the
// fragments of k-step ks + 1 already requested when it runs: step_work may
// branch, and a branch stops the compiler from moving loads above it, so
// the loads are placed early here by hand.
template <typename T, int MT, int NT, int KSTEPS, bool kATrans, bool kBKn, typename StepWork>
__device__ __forceinline__ void warp_gemm_with_work(float (&acc)[MT][NT][4], const T* a, int lda, int am0, const T* b,
                                                    int ldb, int bn0, int lane, StepWork step_work) {
  std::uint32_t af[2][MT][4];
  std::uint32_t bf[2][NT][2];
  load_step<T, MT, NT, kATrans, kBKn>(af[0], bf[0], a, lda, am0, b, ldb, bn0, 0, lane);
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ++ks) {
    if (ks + 1 < KSTEPS)
      load_step<T, MT, NT, kATrans, kBKn>(af[(ks + 1) & 1], bf[(ks + 1) & 1], a, lda, am0, b, ldb, bn0, ks + 1, lane);
    step_work(ks);
    mma_step<T>(acc, af[ks & 1], bf[ks & 1]);
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.0f;
}

// Thread -> 16-byte chunk map of a [rows][D] tile copy: each pass covers
// kRowsPerPass whole rows with the first kRowsPerPass * D/8 threads.
template <int D>
struct ChunkMap {
  static constexpr int kChunksPerRow = D / 8;
  static constexpr int kRowsPerPass = 256 / kChunksPerRow;
  static constexpr int kActive = kRowsPerPass * kChunksPerRow;
};

// rows x D elements of one head, rows row0.. of a sequence, into a shared
// [rows][D + 8] tile; rows at or past `valid` and columns at or past `cols`
// (the caller's head dim, a multiple of 8 up to D) are zero-filled.
template <int ROWS, int D, typename T>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, const RowStrides& st, int b, int seq_start,
                                                int row0, int valid, int head, int tid, int cols) {
  using M = ChunkMap<D>;
  if (M::kActive < 256 && tid >= M::kActive) return;
  const int r0 = tid / M::kChunksPerRow;
  const int col = (tid % M::kChunksPerRow) * 8;
  if (col >= cols) valid = 0;
  // One 64-bit row offset per tile, then a fixed step: per-row offsets cost
  // a wide multiply each, on the backward's per-item critical path.
  const T* first = src + row_offset(st, b, seq_start, row0 + r0, head) + col;
  const std::int64_t step = static_cast<std::int64_t>(M::kRowsPerPass) * st.row;
#pragma unroll
  for (int it = 0; it < (ROWS + M::kRowsPerPass - 1) / M::kRowsPerPass; ++it) {
    const int r = r0 + it * M::kRowsPerPass;
    if (ROWS % M::kRowsPerPass == 0 || r < ROWS) {
      const bool ok = r < valid;
      cp_async_16(dst + r * (D + 8) + col, ok ? first + it * step : src, ok);
    }
  }
}

// A shared [rows][D + 8] tile -> rows [0, valid), columns [0, cols) of one
// head in global memory.
template <int ROWS, int D, typename T>
__device__ __forceinline__ void store_tile(T* dst, const RowStrides& st, int b, int seq_start, int row0, int valid,
                                           int head, const T* src, int tid, int cols) {
  using M = ChunkMap<D>;
  if (M::kActive < 256 && tid >= M::kActive) return;
  const int r0 = tid / M::kChunksPerRow;
  const int col = (tid % M::kChunksPerRow) * 8;
  if (col >= cols) return;
  T* base = dst + row_offset(st, b, seq_start, row0 + r0, head) + col;
  const std::int64_t step = static_cast<std::int64_t>(M::kRowsPerPass) * st.row;
#pragma unroll
  for (int it = 0; it < (ROWS + M::kRowsPerPass - 1) / M::kRowsPerPass; ++it) {
    const int r = r0 + it * M::kRowsPerPass;
    if ((ROWS % M::kRowsPerPass == 0 || r < ROWS) && r < valid)
      *reinterpret_cast<uint4*>(base + it * step) = *reinterpret_cast<const uint4*>(src + r * (D + 8) + col);
  }
}

// 4 bytes global -> shared (zero-filled when !valid).
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

// Raw lse and dsum of rows m0 .. m0 + ROWS of (b, h) into shared memory, by
// threads tid < ROWS; rows past the sequence read as 0 (they are masked).
template <int ROWS>
__device__ __forceinline__ void load_stats_async(float* s_lse, float* s_dsum, const BackwardParams& p,
                                                 const SeqBounds& seq, int b, int h, int m0,
                                                 std::int64_t accum_row0, int tid) {
  if (tid < ROWS) {
    const int i = m0 + tid;
    const bool ok = i < seq.q_len;
    cp_async_4(s_lse + tid, ok ? p.lse + lse_offset(p, b, seq.q_start, i, h) : p.lse, ok);
    cp_async_4(s_dsum + tid, ok ? p.dsum + static_cast<std::int64_t>(h) * p.total_q_rows + accum_row0 + i : p.dsum,
               ok);
  }
}

// S, dP of a warp's [kRowsS x kColsS] part of the tile -> P (into s) and dS
// (into dp) with softcap and/or ALiBi; `masked`: the tile needs the
// per-element mask (rows >= q_len and the score rules). With Dropout, Z =
// mask / (1 - p): dV's operand becomes Z P and dS = P (Z dP - dsum) (dsum is
// dO . O of the dropped output, so it needs no change).
template <int D, bool Dropout>
__device__ __forceinline__ void scores_to_grads(float (&s)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                                float (&dp)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                                const float* s_lse, const float* s_dsum, const ScoreRules& rules,
                                                const DropoutHead& drop, bool masked, int q_len, int m0, int n0,
                                                int row0, int col0, int lane) {
  using Tr = FlashBwdTraits<D>;
  const int g = lane >> 2, t = lane & 3;
  const bool softcap = rules.cap_log2 != 0.0f;
  const std::uint64_t kept_bits =
      Dropout ? dropout_keep_bits<Tr::kMTS, Tr::kNTS>(drop, m0 + row0 + g, n0 + col0, t) : 0;
#pragma unroll
  for (int mi = 0; mi < Tr::kMTS; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + mi * 16 + g + half * 8;
      const float lse2 = lse_base2(s_lse[r]);
      const float dsum = s_dsum[r];
      const int i = m0 + r;
#pragma unroll
      for (int ni = 0; ni < Tr::kNTS; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mi][ni][half * 2 + e];
          float& y = dp[mi][ni][half * 2 + e];
          const int j = n0 + col0 + ni * 8 + 2 * t + e;
          float th;
          const float logit = rules.logit2(x, i, j, rules.alibi_log2, &th);
          const bool vis = !masked || (i < q_len && rules.visible(i, j));
          const float pv = vis ? fast_exp2(logit - lse2) : 0.0f;
          float z = 1.0f;
          if constexpr (Dropout)
            z = dropout_kept<Tr::kNTS>(kept_bits, mi * 2 + half, ni, e) ? drop.keep_scale : 0.0f;
          float dsv = pv * (y * z - dsum);
          if (softcap) dsv *= ScoreRules::softcap_grad(th);
          x = pv * z;
          y = dsv;
        }
      }
    }
  }
}

// P of a warp's part of the tile from S (no softcap/ALiBi); kMasked: zero
// the keys outside each row's visible range and the rows past q_len.
template <int D, bool kMasked>
__device__ __forceinline__ void scores_to_probs(float (&s)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                                const float* s_lse, const ScoreRules& rules, int q_len, int m0,
                                                int n0, int row0, int col0, int lane) {
  using Tr = FlashBwdTraits<D>;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < Tr::kMTS; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + mi * 16 + g + half * 8;
      const float lse2 = lse_base2(s_lse[r]);
      const int i = m0 + r;
      int key_lo = 0, key_hi = Tr::kColsS;  // relative to this warp's first column
      if constexpr (kMasked) {
        if (i < q_len) {
          rules.row_keys(i, &key_lo, &key_hi);
          key_lo -= n0 + col0;
          key_hi -= n0 + col0;
        } else {
          key_hi = key_lo;
        }
      }
#pragma unroll
      for (int ni = 0; ni < Tr::kNTS; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mi][ni][half * 2 + e];
          const float pv = fast_exp2(fmaf(x, rules.scale_log2, -lse2));
          if constexpr (kMasked) {
            const int jj = ni * 8 + 2 * t + e;
            x = jj >= key_lo && jj < key_hi ? pv : 0.0f;
          } else {
            x = pv;
          }
        }
      }
    }
  }
}

// dS = P * (dP - dsum), into dp.
template <int D>
__device__ __forceinline__ void probs_to_grads(const float (&prob)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                               float (&dp)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                               const float* s_dsum, int row0, int lane) {
  using Tr = FlashBwdTraits<D>;
  const int g = lane >> 2;
#pragma unroll
  for (int mi = 0; mi < Tr::kMTS; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float dsum = s_dsum[row0 + mi * 16 + g + half * 8];
#pragma unroll
      for (int ni = 0; ni < Tr::kNTS; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& y = dp[mi][ni][half * 2 + e];
          y = prob[mi][ni][half * 2 + e] * (y - dsum);
        }
    }
}

// One tile's P (into s) and dS (into dp) for a warp: S = Q K^T, dP = dO V^T.
// Without softcap/ALiBi, P is computed between the two GEMMs, in the same
// straight-line code as dP's products, so that the exponentials (MUFU) run
// while the tensor cores work; each of the three cases carries its own copy
// of dP's GEMM for that reason. Dropout takes the general path (its own
// instantiation), where dP is ready when P is formed.
template <typename T, int D, bool Dropout>
__device__ __forceinline__ void tile_probs_and_grads(float (&s)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                                     float (&dp)[FlashBwdTraits<D>::kMTS][FlashBwdTraits<D>::kNTS][4],
                                                     const T* q_tile, const T* do_tile, const T* k_tile,
                                                     const T* v_tile, const float* s_lse, const float* s_dsum,
                                                     const ScoreRules& rules, const DropoutHead& drop, bool masked,
                                                     int q_len, int m0, int n0, int row0, int col0, int lane) {
  using Tr = FlashBwdTraits<D>;
  constexpr int LD = Tr::kLd;
  zero(s);
  zero(dp);
  warp_gemm<T, Tr::kMTS, Tr::kNTS, D / 16, false, false>(s, q_tile, LD, row0, k_tile, LD, col0, lane);
  auto dp_gemm = [&] { warp_gemm<T, Tr::kMTS, Tr::kNTS, D / 16, false, false>(dp, do_tile, LD, row0, v_tile, LD, col0, lane); };
  if (Dropout || rules.transformed) {
    dp_gemm();
    scores_to_grads<D, Dropout>(s, dp, s_lse, s_dsum, rules, drop, masked, q_len, m0, n0, row0, col0, lane);
  } else if (masked) {
    scores_to_probs<D, true>(s, s_lse, rules, q_len, m0, n0, row0, col0, lane);
    dp_gemm();
    probs_to_grads<D>(s, dp, s_dsum, row0, lane);
  } else {
    scores_to_probs<D, false>(s, s_lse, rules, q_len, m0, n0, row0, col0, lane);
    dp_gemm();
    probs_to_grads<D>(s, dp, s_dsum, row0, lane);
  }
}

// A warp's C fragments -> a shared [..][ld] tile as T (times `scale`).
template <typename T, int MT, int NT>
__device__ __forceinline__ void store_frags(T* dst, int ld, int row0, int col0, const float (&acc)[MT][NT][4],
                                            float scale, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < MT; ++mi)
#pragma unroll
    for (int ni = 0; ni < NT; ++ni)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row0 + mi * 16 + g + half * 8;
        const int c = col0 + ni * 8 + 2 * t;
        *reinterpret_cast<std::uint32_t*>(dst + r * ld + c) =
            pack2<T>(acc[mi][ni][half * 2] * scale, acc[mi][ni][half * 2 + 1] * scale);
      }
}

__device__ __forceinline__ void atomic_add2(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(dst), make_float2(x, y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

}  // namespace bwd

// ---------------------------------------------------------------------------
// dsum[h][row] = dot(dout[row, h], out[row, h]), and (unless deterministic)
// dq_accum[h][row][:] = 0 for the atomics that follow. A (row, head) pair is
// a "slot", slot = row * Hq + h, so consecutive slots are consecutive memory
// in [B, S, H, D]. kLanes lanes share a slot (one 16-byte chunk each) and
// every lane has kUnroll slots' loads in flight: with one warp per slot and a
// single load per lane (the first version) a D = 64 call kept only 8 lanes'
// 16 bytes of each warp in flight, far too little to fill HBM.
// Rows: dense b * max_q_len + i, varlen every packed row of q.
// ---------------------------------------------------------------------------
template <int D>
struct DsumShape {
  static constexpr int kChunks = D / 8;
  static constexpr int kLanes = kChunks <= 4 ? 4 : kChunks <= 8 ? 8 : kChunks <= 16 ? 16 : 32;
  static constexpr int kGroups = 32 / kLanes;  // slots side by side in a warp
  static constexpr int kUnroll = 4;            // slots per lane group
  static constexpr int kSlotsPerWarp = kGroups * kUnroll;
  static constexpr int kWarps = 8;
  static_assert(kChunks <= 32, "one chunk per lane");
};

template <typename T, int D>
__global__ void __launch_bounds__(DsumShape<D>::kWarps * 32)
    flash_bwd_dsum_kernel(const __grid_constant__ BackwardParams p) {
  using Shape = DsumShape<D>;
  const int lane = threadIdx.x % 32, group = lane / Shape::kLanes, chunk = lane % Shape::kLanes;
  const std::int64_t slots = p.total_q_rows * p.heads_q;
  const std::int64_t first =
      (static_cast<std::int64_t>(blockIdx.x) * Shape::kWarps + threadIdx.x / 32) * Shape::kSlotsPerWarp + group;
  uint4 ov[Shape::kUnroll], dv[Shape::kUnroll];
  std::int64_t row_of[Shape::kUnroll];
  int h_of[Shape::kUnroll];
#pragma unroll
  for (int u = 0; u < Shape::kUnroll; ++u) {
    const std::int64_t slot = first + u * Shape::kGroups;
    const std::int64_t row = slot / p.heads_q;
    const int h = static_cast<int>(slot % p.heads_q);
    row_of[u] = row;
    h_of[u] = h;
    ov[u] = dv[u] = make_uint4(0, 0, 0, 0);
    if (slot < slots && chunk < Shape::kChunks && chunk * 8 < p.head_dim) {  // columns past head_dim add 0
      int b = 0, i = static_cast<int>(row);
      if (p.cu_seqlens_q == nullptr) {
        b = static_cast<int>(row / p.max_q_len);
        i = static_cast<int>(row % p.max_q_len);
      }
      ov[u] = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.out) + row_offset(p.out_strides, b, 0, i, h) +
                                              chunk * 8);
      dv[u] = *reinterpret_cast<const uint4*>(static_cast<const T*>(p.dout) +
                                              row_offset(p.dout_strides, b, 0, i, h) + chunk * 8);
    }
  }
#pragma unroll
  for (int u = 0; u < Shape::kUnroll; ++u) {
    const std::int64_t slot = first + u * Shape::kGroups;
    const std::uint32_t ow[4] = {ov[u].x, ov[u].y, ov[u].z, ov[u].w};
    const std::uint32_t dw[4] = {dv[u].x, dv[u].y, dv[u].z, dv[u].w};
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = unpack2<T>(ow[k]);
      const float2 c = unpack2<T>(dw[k]);
      sum = fmaf(a.x, c.x, sum);
      sum = fmaf(a.y, c.y, sum);
    }
#pragma unroll
    for (int m = Shape::kLanes / 2; m >= 1; m >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, m);
    if (slot >= slots) continue;
    const std::int64_t at = static_cast<std::int64_t>(h_of[u]) * p.total_q_rows + row_of[u];
    if (chunk == 0) p.dsum[at] = sum;
    if (!p.deterministic && chunk < Shape::kChunks) {
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + at * D + chunk * 8);
      acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
}

// ---------------------------------------------------------------------------
// dq = softmax_scale * dq_accum as T; 8 elements per thread. Varlen rows past
// cu_seqlens_q[batch] belong to no sequence and are not written.
// ---------------------------------------------------------------------------
template <typename T, int D>
__global__ void __launch_bounds__(256) flash_bwd_convert_dq_kernel(const __grid_constant__ BackwardParams p) {
  constexpr int kChunks = D / 8;
  const std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.total_q_rows * p.heads_q * kChunks) return;
  const int chunk = static_cast<int>(idx % kChunks);
  if (chunk * 8 >= p.head_dim) return;  // dq_accum's columns past the caller's head dim
  const std::int64_t rest = idx / kChunks;
  const int h = static_cast<int>(rest % p.heads_q);
  const std::int64_t row = rest / p.heads_q;
  int b = 0, i = static_cast<int>(row);
  if (p.cu_seqlens_q == nullptr) {
    b = static_cast<int>(row / p.max_q_len);
    i = static_cast<int>(row % p.max_q_len);
  } else if (row >= p.cu_seqlens_q[p.batch]) {
    return;
  }
  const float* src = p.dq_accum + (static_cast<std::int64_t>(h) * p.total_q_rows + row) * D + chunk * 8;
  const float4 a = *reinterpret_cast<const float4*>(src);
  const float4 c = *reinterpret_cast<const float4*>(src + 4);
  const float s = p.softmax_scale;
  uint4 out;
  out.x = pack2<T>(a.x * s, a.y * s);
  out.y = pack2<T>(a.z * s, a.w * s);
  out.z = pack2<T>(c.x * s, c.y * s);
  out.w = pack2<T>(c.z * s, c.w * s);
  *reinterpret_cast<uint4*>(static_cast<T*>(p.dq) + row_offset(p.dq_strides, b, 0, i, h) + chunk * 8) = out;
}

// ---------------------------------------------------------------------------
// Main kernel: grid (key blocks, heads_kv, batch). `stages` (1 or 2) is the
// number of Q/dO buffers: 2 prefetches the next tile during the current one.
// ---------------------------------------------------------------------------
template <typename T, int D, bool Dropout>
__global__ void __launch_bounds__(256, 1) flash_bwd_dkdv_kernel(const __grid_constant__ BackwardParams p, int stages) {
  using Tr = FlashBwdTraits<D>;
  using Tile = typename Tr::Tile;
  constexpr int BM = Tr::BM, BN = Tr::BN, LD = Tr::kLd, LDS = Tr::kLdS;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + BN * LD;
  T* sQ = sV + BN * LD;
  T* sdO = sQ + stages * BM * LD;
  T* sP = sdO + stages * BM * LD;
  T* sdS = sP + BM * LDS;
  float* sLse = reinterpret_cast<float*>(sdS + BM * LDS);  // [2][BM], raw lse
  float* sDsum = sLse + 2 * BM;                            // [2][BM]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int n_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  const int n0 = n_block * BN;
  if (n0 >= seq.k_len) return;  // varlen: past this sequence's keys
  const int n1 = min(n0 + BN, seq.k_len);
  const std::int64_t accum_row0 =
      p.cu_seqlens_q != nullptr ? static_cast<std::int64_t>(seq.q_start) : static_cast<std::int64_t>(b) * p.max_q_len;

  // Work items: (query head of the group) x (query block that sees the keys).
  std::int64_t row_lo, row_hi;
  query_rows_seeing(p, seq, n0, n1, &row_lo, &row_hi);
  const int m_lo = row_lo < row_hi ? static_cast<int>(row_lo / BM) : 0;
  const int m_count = row_lo < row_hi ? static_cast<int>((row_hi + BM - 1) / BM) - m_lo : 0;
  const int items = m_count * p.group;
  const int h0 = hk * p.group;

  const T* gQ = static_cast<const T*>(p.q);
  const T* gK = static_cast<const T*>(p.k);
  const T* gV = static_cast<const T*>(p.v);
  const T* gdO = static_cast<const T*>(p.dout);

  // Warp positions in the three GEMMs.
  const int s_row0 = (warp % Tile::kWarpsMS) * Tr::kRowsS, s_col0 = (warp / Tile::kWarpsMS) * Tr::kColsS;
  const int kv_row0 = (warp % Tile::kWarpsNKV) * Tr::kRowsKV, kv_col0 = (warp / Tile::kWarpsNKV) * Tr::kColsKV;
  const int q_row0 = (warp % Tile::kWarpsMQ) * Tr::kRowsQ, q_col0 = (warp / Tile::kWarpsMQ) * Tr::kColsQ;

  float acc_dk[Tr::kMTKV][Tr::kNTKV][4];
  float acc_dv[Tr::kMTKV][Tr::kNTKV][4];
  bwd::zero(acc_dk);
  bwd::zero(acc_dv);

  if (items > 0) {
    bwd::load_tile_async<BN, D>(sK, gK, p.k_strides, b, seq.k_start, n0, seq.k_len - n0, hk, tid, p.head_dim);
    bwd::load_tile_async<BN, D>(sV, gV, p.v_strides, b, seq.k_start, n0, seq.k_len - n0, hk, tid, p.head_dim);
    const int m0 = m_lo * BM;
    bwd::load_tile_async<BM, D>(sQ, gQ, p.q_strides, b, seq.q_start, m0, seq.q_len - m0, h0, tid, p.head_dim);
    bwd::load_tile_async<BM, D>(sdO, gdO, p.dout_strides, b, seq.q_start, m0, seq.q_len - m0, h0, tid, p.head_dim);
    bwd::load_stats_async<BM>(sLse, sDsum, p, seq, b, h0, m0, accum_row0, tid);
    cp_async_commit();
  }

  // Items run head by head, query block by query block; counters rather than
  // an item index, whose divisions sat on the loop's critical path. `parity`
  // picks the Q/dO and stats buffers.
  const int m_end = m_lo + m_count;
  const int h_end = items > 0 ? h0 + p.group : h0;
  int h = h0, m_block = m_lo, parity = 0;
  while (h < h_end) {
    const int m0 = m_block * BM;
    const int cur = stages == 2 ? parity : 0;
    const bool next_head = m_block + 1 == m_end;
    const int h_next = next_head ? h + 1 : h;
    const bool has_next = h_next < h_end;
    const int m0_next = next_head ? m_lo * BM : m0 + BM;

    cp_async_wait<0>();
    __syncthreads();  // Q/dO[cur] and stats of this item visible; everyone is done with the last

    if (stages == 2 && has_next) {
      bwd::load_tile_async<BM, D>(sQ + (cur ^ 1) * BM * LD, gQ, p.q_strides, b, seq.q_start, m0_next,
                                  seq.q_len - m0_next, h_next, tid, p.head_dim);
      bwd::load_tile_async<BM, D>(sdO + (cur ^ 1) * BM * LD, gdO, p.dout_strides, b, seq.q_start, m0_next,
                                  seq.q_len - m0_next, h_next, tid, p.head_dim);
      bwd::load_stats_async<BM>(sLse + (parity ^ 1) * BM, sDsum + (parity ^ 1) * BM, p, seq, b, h_next, m0_next,
                                accum_row0, tid);
      cp_async_commit();
    }

    const T* q_tile = sQ + cur * BM * LD;
    const T* do_tile = sdO + cur * BM * LD;
    const ScoreRules rules = score_rules(p, seq, b, h);
    const DropoutHead drop = Dropout ? dropout_head(p, b, h) : DropoutHead{};

    // P and dS of this tile.
    float s[Tr::kMTS][Tr::kNTS][4];
    float dp[Tr::kMTS][Tr::kNTS][4];
    const bool masked = !rules.tile_unmasked(m0, BM, n0, BN) || m0 + BM > seq.q_len;
    bwd::tile_probs_and_grads<T, D, Dropout>(s, dp, q_tile, do_tile, sK, sV, sLse + parity * BM,
                                             sDsum + parity * BM, rules, drop, masked, seq.q_len, m0, n0, s_row0,
                                             s_col0, lane);
    bwd::store_frags<T>(sP, LDS, s_row0, s_col0, s, 1.0f, lane);
    bwd::store_frags<T>(sdS, LDS, s_row0, s_col0, dp, 1.0f, lane);
    __syncthreads();  // P, dS complete

    // dV += P^T dO.
    bwd::warp_gemm<T, Tr::kMTKV, Tr::kNTKV, BM / 16, true, true>(acc_dv, sP, LDS, kv_row0, do_tile, LD, kv_col0,
                                                                  lane);
    // dQ += dS K, into the fp32 accumulator, in kDqPasses column slices per
    // warp (to bound the registers live next to dK and dV). The last slice's
    // reductions are spread over dK's GEMM, so that they drain while the
    // tensor cores work instead of queueing behind each other.
    if (!p.deterministic) {
      constexpr int kNT = Tr::kNTQ / Tr::kDqPasses;
      const int g = lane >> 2, t = lane & 3;
      const int row = m0 + q_row0 + g;
      // Head-major dq_accum: the rows of a tile are D floats apart, a constant
      // the reductions fold into their immediate offsets.
      float* const dq_row = p.dq_accum + (static_cast<std::int64_t>(h) * p.total_q_rows + accum_row0 + row) * D + 2 * t;
      float acc_dq[Tr::kMTQ][kNT][4];
      // Rows (mi, half) of acc_dq -> dq_accum at column slice col0.
      auto reduce_rows = [&](int mi, int half, int col0) {
        if (row + mi * 16 + half * 8 < seq.q_len) {
#pragma unroll
          for (int ni = 0; ni < kNT; ++ni)
            bwd::atomic_add2(dq_row + (mi * 16 + half * 8) * D + col0 + ni * 8, acc_dq[mi][ni][half * 2],
                             acc_dq[mi][ni][half * 2 + 1]);
        }
      };
#pragma unroll
      for (int pass = 0; pass < Tr::kDqPasses; ++pass) {
        const int col0 = q_col0 + pass * kNT * 8;
        bwd::zero(acc_dq);
        bwd::warp_gemm<T, Tr::kMTQ, kNT, BN / 16, false, true>(acc_dq, sdS, LDS, q_row0, sK, LD, col0, lane);
        if (pass + 1 < Tr::kDqPasses) {
#pragma unroll
          for (int mi = 0; mi < Tr::kMTQ; ++mi)
#pragma unroll
            for (int half = 0; half < 2; ++half) reduce_rows(mi, half, col0);
        }
      }
      // dK += dS^T Q with the last slice's row groups spread over its k-steps.
      constexpr int kGroups = Tr::kMTQ * 2, kSteps = BM / 16;
      static_assert(kSteps % kGroups == 0 || kGroups % kSteps == 0);
      const int last_col0 = q_col0 + (Tr::kDqPasses - 1) * kNT * 8;
      bwd::warp_gemm_with_work<T, Tr::kMTKV, Tr::kNTKV, kSteps, true, true>(
          acc_dk, sdS, LDS, kv_row0, q_tile, LD, kv_col0, lane, [&](int ks) {
            if constexpr (kSteps >= kGroups) {
              if (ks % (kSteps / kGroups) == 0) {
                const int grp = ks / (kSteps / kGroups);
                reduce_rows(grp / 2, grp % 2, last_col0);
              }
            } else {
#pragma unroll
              for (int k = 0; k < kGroups / kSteps; ++k) {
                const int grp = ks * (kGroups / kSteps) + k;
                reduce_rows(grp / 2, grp % 2, last_col0);
              }
            }
          });
    } else {
      // dK += dS^T Q.
      bwd::warp_gemm<T, Tr::kMTKV, Tr::kNTKV, BM / 16, true, true>(acc_dk, sdS, LDS, kv_row0, q_tile, LD, kv_col0,
                                                                    lane);
    }

    if (stages == 1 && has_next) {
      __syncthreads();  // everyone is done with Q/dO
      bwd::load_tile_async<BM, D>(sQ, gQ, p.q_strides, b, seq.q_start, m0_next, seq.q_len - m0_next, h_next, tid, p.head_dim);
      bwd::load_tile_async<BM, D>(sdO, gdO, p.dout_strides, b, seq.q_start, m0_next, seq.q_len - m0_next, h_next,
                                  tid, p.head_dim);
      bwd::load_stats_async<BM>(sLse + (parity ^ 1) * BM, sDsum + (parity ^ 1) * BM, p, seq, b, h_next, m0_next,
                                accum_row0, tid);
      cp_async_commit();
    }
    h = h_next;
    m_block = next_head ? m_lo : m_block + 1;
    parity ^= 1;
  }

  // dK * softmax_scale and dV as T, staged through sK/sV for 16-byte stores.
  __syncthreads();
  bwd::store_frags<T>(sK, LD, kv_row0, kv_col0, acc_dk, p.softmax_scale, lane);
  bwd::store_frags<T>(sV, LD, kv_row0, kv_col0, acc_dv, 1.0f, lane);
  // Re-read rather than keep the key range live across the loop (registers).
  const int k_start = p.cu_seqlens_k != nullptr ? __ldg(p.cu_seqlens_k + b) : 0;
  __syncthreads();
  bwd::store_tile<BN, D>(static_cast<T*>(p.dk), p.dk_strides, b, k_start, n0, n1 - n0, hk, sK, tid, p.head_dim);
  bwd::store_tile<BN, D>(static_cast<T*>(p.dv), p.dv_strides, b, k_start, n0, n1 - n0, hk, sV, tid, p.head_dim);
}

// ---------------------------------------------------------------------------
// Deterministic dQ: grid (query blocks, heads_q, batch), heaviest (last)
// query blocks first. `stages` (1 or 2) is the number of K/V buffers.
// ---------------------------------------------------------------------------
template <typename T, int D, bool Dropout>
__global__ void __launch_bounds__(256, 1) flash_bwd_dq_kernel(const __grid_constant__ BackwardParams p, int stages) {
  using Tr = FlashBwdTraits<D>;
  using Tile = typename Tr::Tile;
  constexpr int BM = Tr::BM, BN = Tr::BN, LD = Tr::kLd, LDS = Tr::kLdS;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + BM * LD;
  T* sK = sdO + BM * LD;
  T* sV = sK + stages * BN * LD;
  T* sdS = sV + stages * BN * LD;
  float* sLse = reinterpret_cast<float*>(sdS + BM * LDS);  // [BM]
  float* sDsum = sLse + BM;                                // [BM]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m_block = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  const int m0 = m_block * BM;
  if (m0 >= seq.q_len) return;
  const int hk = h / p.group;
  const std::int64_t accum_row0 =
      p.cu_seqlens_q != nullptr ? static_cast<std::int64_t>(seq.q_start) : static_cast<std::int64_t>(b) * p.max_q_len;
  const ScoreRules rules = score_rules(p, seq, b, h);
  const DropoutHead drop = Dropout ? dropout_head(p, b, h) : DropoutHead{};

  int key_lo, key_hi;
  rules.key_range(m0, min(BM, seq.q_len - m0), &key_lo, &key_hi);
  const int nb_lo = key_lo / BN;
  const int items = key_hi > key_lo ? (key_hi + BN - 1) / BN - nb_lo : 0;

  const T* gK = static_cast<const T*>(p.k);
  const T* gV = static_cast<const T*>(p.v);

  const int s_row0 = (warp % Tile::kWarpsMS) * Tr::kRowsS, s_col0 = (warp / Tile::kWarpsMS) * Tr::kColsS;
  const int q_row0 = (warp % Tile::kWarpsMQ) * Tr::kRowsQ, q_col0 = (warp / Tile::kWarpsMQ) * Tr::kColsQ;

  float acc_dq[Tr::kMTQ][Tr::kNTQ][4];
  bwd::zero(acc_dq);

  if (items > 0) {
    bwd::load_tile_async<BM, D>(sQ, static_cast<const T*>(p.q), p.q_strides, b, seq.q_start, m0, seq.q_len - m0, h,
                                tid, p.head_dim);
    bwd::load_tile_async<BM, D>(sdO, static_cast<const T*>(p.dout), p.dout_strides, b, seq.q_start, m0,
                                seq.q_len - m0, h, tid, p.head_dim);
    const int n0 = nb_lo * BN;
    bwd::load_tile_async<BN, D>(sK, gK, p.k_strides, b, seq.k_start, n0, seq.k_len - n0, hk, tid, p.head_dim);
    bwd::load_tile_async<BN, D>(sV, gV, p.v_strides, b, seq.k_start, n0, seq.k_len - n0, hk, tid, p.head_dim);
    bwd::load_stats_async<BM>(sLse, sDsum, p, seq, b, h, m0, accum_row0, tid);
    cp_async_commit();
  }

  for (int it = 0; it < items; ++it) {
    const int n0 = (nb_lo + it) * BN;
    const int cur = stages == 2 ? (it & 1) : 0;
    const bool has_next = it + 1 < items;
    const int n0_next = n0 + BN;

    cp_async_wait<0>();
    __syncthreads();
    if (stages == 2 && has_next) {
      bwd::load_tile_async<BN, D>(sK + (cur ^ 1) * BN * LD, gK, p.k_strides, b, seq.k_start, n0_next,
                                  seq.k_len - n0_next, hk, tid, p.head_dim);
      bwd::load_tile_async<BN, D>(sV + (cur ^ 1) * BN * LD, gV, p.v_strides, b, seq.k_start, n0_next,
                                  seq.k_len - n0_next, hk, tid, p.head_dim);
      cp_async_commit();
    }
    const T* k_tile = sK + cur * BN * LD;
    const T* v_tile = sV + cur * BN * LD;

    float s[Tr::kMTS][Tr::kNTS][4];
    float dp[Tr::kMTS][Tr::kNTS][4];
    const bool masked = !rules.tile_unmasked(m0, BM, n0, BN) || m0 + BM > seq.q_len;
    bwd::tile_probs_and_grads<T, D, Dropout>(s, dp, sQ, sdO, k_tile, v_tile, sLse, sDsum, rules, drop, masked,
                                             seq.q_len, m0, n0, s_row0, s_col0, lane);
    bwd::store_frags<T>(sdS, LDS, s_row0, s_col0, dp, 1.0f, lane);
    __syncthreads();  // dS complete

    bwd::warp_gemm<T, Tr::kMTQ, Tr::kNTQ, BN / 16, false, true>(acc_dq, sdS, LDS, q_row0, k_tile, LD, q_col0, lane);

    if (stages == 1 && has_next) {
      __syncthreads();  // everyone is done with K/V
      bwd::load_tile_async<BN, D>(sK, gK, p.k_strides, b, seq.k_start, n0_next, seq.k_len - n0_next, hk, tid, p.head_dim);
      bwd::load_tile_async<BN, D>(sV, gV, p.v_strides, b, seq.k_start, n0_next, seq.k_len - n0_next, hk, tid, p.head_dim);
      cp_async_commit();
    }
  }

  // dq = softmax_scale * dQ as T, staged through sQ.
  __syncthreads();
  bwd::store_frags<T>(sQ, LD, q_row0, q_col0, acc_dq, p.softmax_scale, lane);
  __syncthreads();
  bwd::store_tile<BM, D>(static_cast<T*>(p.dq), p.dq_strides, b, seq.q_start, m0, seq.q_len - m0, h, sQ, tid, p.head_dim);
}

}  // namespace cuflash::detail::sm80
