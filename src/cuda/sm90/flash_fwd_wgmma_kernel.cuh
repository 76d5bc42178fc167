// FlashAttention forward on Hopper warpgroup MMA (wgmma, sm90a).
//
// One CTA of two warpgroups computes 128 query rows of one (batch, head), 64
// rows per warpgroup, against the key tiles they can see (or one split's
// share of them). S = Q K^T takes Q and K from shared memory; O += P V takes
// P from registers (the S accumulators rounded to 16 bits, as on sm80) and V
// from shared memory, transposed by the instruction. All 256 threads load the
// tiles with cp.async into 128-byte-swizzled shared memory, Stages tiles deep.
//
// Within a warpgroup the GEMMs of neighbouring tiles overlap the softmax:
// iteration j issues S_j = Q K_j^T and then O += P_{j-1} V_{j-1}, waits for
// S_j only, computes P_j while P_{j-1} V_{j-1} runs, and rescales O once that
// finishes. The two warpgroups run the same schedule on different rows, so
// one's softmax also fills the other's tensor-core gaps.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/forward_block.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm90/sw128_tile.hpp"
#include "sm90/wgmma.cuh"

namespace cuflash::detail::sm90 {

template <typename T, int D_, int BN_, int Stages_, int MinBlocks_>
struct WgmmaFwdConfig {
  using Element = T;
  static constexpr int D = D_, BM = 128, BN = BN_, kWarpGroups = 2, kThreads = 128 * kWarpGroups;
  static constexpr int Stages = Stages_;        // K (and V) tiles in shared memory
  static constexpr int MinBlocks = MinBlocks_;  // CTAs per SM the registers are sized for
  static constexpr int NT = BN / 8;   // n8 column blocks of S per warp
  static constexpr int DT = D / 8;    // n8 column blocks of O per warp
  static constexpr int KQ = D / 16;   // k-steps of Q K^T
  static constexpr int KP = BN / 16;  // k-steps of P V
  using QTile = Sw128Tile<BM, D>;
  using KVTile = Sw128Tile<BN, D>;
  // Q, then Stages x (K, V); 1 KiB of slack to align the base to an atom.
  static constexpr int kSmemBytes = QTile::kBytes + 2 * Stages * KVTile::kBytes + 1024;
  static_assert(Stages >= 2);
  static_assert(BN % 64 == 0 && BN <= 256, "S is one wgmma of N = BN");
  static_assert(kSmemBytes * MinBlocks <= 227 * 1024, "shared memory per SM");
};

// ROWS x D tile of global rows [row0, row0 + ROWS) -> shared memory; rows at
// or past `valid_rows` are zero-filled (never read). Where it can, each
// thread copies one fixed 16-byte column of every (kThreads /
// chunks-per-row)-th row; that step is a multiple of 8 rows, so the thread's
// swizzled column is fixed too and its addresses advance by constants.
template <class C, int ROWS>
__device__ __forceinline__ void load_sw128_tile(typename C::Element* smem, const typename C::Element* global,
                                                std::int64_t row_stride, int row0, int valid_rows) {
  using Tile = Sw128Tile<ROWS, C::D>;
  constexpr int kChunksPerRow = C::D / 8;
  if constexpr (C::kThreads % kChunksPerRow == 0) {
    constexpr int kRowStep = C::kThreads / kChunksPerRow;
    static_assert(kRowStep % 8 == 0 && ROWS % kRowStep == 0);
    const int r = threadIdx.x / kChunksPerRow, c = threadIdx.x % kChunksPerRow;
    const typename C::Element* src = global + (row0 + r) * row_stride + c * 8;
    typename C::Element* dst = smem + Tile::offset(r, c);
#pragma unroll
    for (int it = 0; it < ROWS / kRowStep; ++it) {
      const bool valid = row0 + r + it * kRowStep < valid_rows;
      sm80::cp_async_16(dst + it * kRowStep * 64, valid ? src : global, valid);
      src += kRowStep * row_stride;
    }
  } else {  // head dim 192: a thread's column changes from chunk to chunk
#pragma unroll
    for (int idx = threadIdx.x; idx < ROWS * kChunksPerRow; idx += C::kThreads) {
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const bool valid = row0 + r < valid_rows;
      sm80::cp_async_16(smem + Tile::offset(r, c), valid ? global + (row0 + r) * row_stride + c * 8 : global, valid);
    }
  }
}

// Transformed: softcap or ALiBi is on (every score goes through
// ScoreRules::logit2), a separate instantiation as on sm80.
template <class C, bool Transformed>
__global__ void __launch_bounds__(C::kThreads, C::MinBlocks)
    flash_fwd_wgmma_kernel(const ForwardParams p, const ForwardBlockDivisors divisors) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename C::Element;
  using sm80::cp_async_commit;
  using sm80::cp_async_wait;
  using sm80::pack2;
  extern __shared__ unsigned char smem_raw[];
  // wgmma's swizzle is a function of the address: atoms must be 1 KiB aligned.
  unsigned char* smem_base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  // Q, then stage 0 (K, V), stage 1 (K, V), ...
  constexpr int kStageBytes = 2 * C::KVTile::kBytes;
  T* sQ = reinterpret_cast<T*>(smem_base);
  unsigned char* stage0 = smem_base + C::QTile::kBytes;
  auto sK = [&](int st) { return reinterpret_cast<T*>(stage0 + st * kStageBytes); };
  auto sV = [&](int st) { return reinterpret_cast<T*>(stage0 + st * kStageBytes + C::KVTile::kBytes); };

  const ForwardBlock f = forward_block<C::BM, C::BN>(p, divisors);
  if (!f.active) return;
  const SeqBounds& seq = f.seq;
  const ScoreRules& rules = f.rules;
  const int b = f.b, h = f.h, hk = f.hk, m0 = f.m0, rows_here = f.rows, t_lo = f.t_lo, t_hi = f.t_hi;

  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int warp_row0 = wg * 64 + warp * 16;  // within the block

  float o[C::DT][4];
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[dt][e] = 0.0f;
  // Multiplier from the (possibly transformed) score to a base-2 logit.
  const float mult = Transformed ? 1.0f : rules.scale_log2;

  if (t_lo < t_hi) {
    const T* q_base = static_cast<const T*>(p.q) + row_offset(p.q_strides, b, seq.q_start, 0, h);
    const T* k_base = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_start, 0, hk);
    const T* v_base = static_cast<const T*>(p.v) + row_offset(p.v_strides, b, seq.k_start, 0, hk);

    // Descriptors: this warpgroup's 64 rows of Q; K and V of each stage.
    const std::uint64_t q_desc = sw128_desc(sQ + wg * 64 * 64, 16, 1024);
    // Stage st's descriptors are stage 0's moved by st * kStageBytes.
    const std::uint64_t k_desc = sw128_desc(sK(0), 16, 1024);
    const std::uint64_t v_desc = sw128_desc(sV(0), C::KVTile::kBlockBytes, 1024);

    // Key tiles from the last to the first: the tiles needing a mask (the
    // causal diagonal, the end of the sequence) come first. Iteration j
    // handles tile t_hi - 1 - j; K_j and V_j sit in stage j % Stages.
    // Copy group g_j brings K_j and V_{j-1} (g_0: Q and K_0); iteration j
    // needs g_j and issues g_{j+Stages-1}, so loads run Stages - 1 tiles
    // ahead. Every iteration commits a group, empty or not, so that "all but
    // the newest Stages - 2 groups have landed" always means g_j.
    const int n_tiles = t_hi - t_lo;
    auto issue_group = [&](int group) {
      if (group < n_tiles)
        load_sw128_tile<C, C::BN>(sK(group % C::Stages), k_base, p.k_strides.row, (t_hi - 1 - group) * C::BN,
                                  seq.k_len);
      if (group >= 1 && group <= n_tiles)
        load_sw128_tile<C, C::BN>(sV((group - 1) % C::Stages), v_base, p.v_strides.row, (t_hi - group) * C::BN,
                                  seq.k_len);
      cp_async_commit();
    };
    load_sw128_tile<C, C::BM>(sQ, q_base, p.q_strides.row, m0, seq.q_len);
#pragma unroll
    for (int group = 0; group < C::Stages - 1; ++group) issue_group(group);

    // This warpgroup's first tiles that none of its 64 rows sees (the
    // causal diagonal's last key tile for the block's first 64 rows): it
    // takes part in their loads and barriers only, and its first GEMMs are
    // those of tile j_first. (The other CTA on the SM has the tensor cores
    // meanwhile.)
    int j_first = 0;
    while (j_first < n_tiles && rules.tile_hidden(m0 + wg * 64, 64, (t_hi - 1 - j_first) * C::BN, C::BN)) ++j_first;
    // (Broadcast, so that the compiler sees it warp-uniform: a branch around
    // wgmma that it thinks divergent serializes every wgmma, C7520.)
    j_first = __shfl_sync(0xffffffffu, j_first, 0);
    std::uint32_t pa[C::KP][4];  // P_{j-1}, the A operand of the pending P V
    float correction[2] = {1.0f, 1.0f};
    for (int j = 0; j < n_tiles; ++j) {
      const int tile = t_hi - 1 - j;
      const int n0 = tile * C::BN;
      const int st = j % C::Stages, prev = (j + C::Stages - 1) % C::Stages;
      // g_j (K_j, V_{j-1}) has landed; every warp finished iteration j - 1,
      // so the stages that held K_{j-1} and V_{j-2} are free for g_{j+Stages-1}.
      cp_async_wait<C::Stages - 2>();
      fence_proxy_async_shared();
      __syncthreads();
      issue_group(j + C::Stages - 1);
      if (j < j_first) continue;

      float s[C::NT][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks)
        wgmma_ss<T, C::BN>(s, desc_advance(q_desc, C::QTile::k_major_step_bytes(ks)),
                           desc_advance(k_desc, st * kStageBytes + C::KVTile::k_major_step_bytes(ks)), ks > 0);
      wgmma_commit();
      if (j > j_first) {
#pragma unroll
        for (int kk = 0; kk < C::KP; ++kk)
          wgmma_rs<T, C::D, true>(o, pa[kk],
                                  desc_advance(v_desc, prev * kStageBytes + C::KVTile::mn_major_step_bytes(kk)), true);
        wgmma_commit();
        wgmma_wait<1>();
      } else {
        wgmma_wait<0>();
      }
      fence_accumulators(s);

      // Scores -> (masked) logits; online softmax.
      const bool masked = !rules.tile_unmasked(m0, rows_here, n0, C::BN);
      online_softmax_m16<C::NT, Transformed, RunningMax::lagging>(s, row_max, row_sum, correction, rules,
                                                                  m0 + warp_row0 + g, n0, masked, t4, mult);
      // P_{j-1} V_{j-1} done: its A registers are free and O can be rescaled.
      wgmma_wait<0>();
      fence_accumulators(o);
      p_fragments_m16<T, C::KP>(s, pa);
      rescale_moved_rows_m16<C::DT>(o, correction);
    }
    // The last P V.
    cp_async_wait<0>();
    fence_proxy_async_shared();
    __syncthreads();
    if (j_first < n_tiles) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk)
        wgmma_rs<T, C::D, true>(
            o, pa[kk],
            desc_advance(v_desc, ((n_tiles - 1) % C::Stages) * kStageBytes + C::KVTile::mn_major_step_bytes(kk)),
            true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(o);
    }
  }

  // Epilogue: normalize, write out (or this split's partial) and lse.
  float inv_sum[2];
  finish_rows_m16(p, f, row_max, row_sum, mult, m0 + warp_row0 + g, t4, inv_sum);
  if (p.num_splits > 1) {
    write_partial_m16<C::D>(p, f, o, inv_sum, m0 + warp_row0 + g, t4);
    return;
  }
  // The output goes through shared memory (a padded row-major staging area
  // over the K/V stages, free once every warp is past its last GEMM), so the
  // global stores are whole 16-byte row chunks.
  __syncthreads();
  constexpr int kOutRow = C::D + 8;
  T* sO = sK(0) + warp_row0 * kOutRow;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    T* srow = sO + (g + half * 8) * kOutRow;
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
      *reinterpret_cast<std::uint32_t*>(srow + dt * 8 + 2 * t4) =
          pack2<T>(o[dt][half * 2] * inv_sum[half], o[dt][half * 2 + 1] * inv_sum[half]);
  }
  __syncwarp();
  T* out_base = static_cast<T*>(p.out) + row_offset(p.out_strides, b, seq.q_start, 0, h);
  constexpr int kChunksPerRow = C::D / 8;
#pragma unroll
  for (int idx = lane; idx < 16 * kChunksPerRow; idx += 32) {
    const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
    const int i = m0 + warp_row0 + r;
    if (i < seq.q_len)
      *reinterpret_cast<uint4*>(out_base + static_cast<std::int64_t>(i) * p.out_strides.row + c * 8) =
          *reinterpret_cast<const uint4*>(sO + r * kOutRow + c * 8);
  }
#endif
}

}  // namespace cuflash::detail::sm90
