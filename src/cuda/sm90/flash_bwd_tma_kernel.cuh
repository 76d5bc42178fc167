// FlashAttention backward on Hopper, warp-specialized (sm_90a): TMA loads by
// a producer warp, the five GEMMs of a tile on wgmma by two consumer
// warpgroups, dQ added into its fp32 accumulator by bulk reductions from a
// third warp.
//
// A CTA owns BN = 128 keys of one kv head (consumer warpgroup c: keys
// [64 c, 64 c + 64)) and walks the query tiles (64 rows) that see them, for
// every query head of the GQA group, so dK and dV sum in registers. Per
// query tile, with the key rows as wgmma's M (S and dP transposed, so that
// P^T and dS^T are already the A fragments of the dV and dK GEMMs):
//   S^T = K Q^T, dP^T = V dO^T              (ss, N = 64 queries)
//   P^T = exp2(logit2 - lse2) and dS^T = P^T (dP^T - dsum) [x softcap's
//   factor] in one block after dP's wait (the exponentials interleave with
//   dS's arithmetic); dV += P^T dO (rs, N = D; B MN-major), under dS's stores
//   dS^T -> shared memory as dS (stmatrix, transposed); both warpgroups' halves in,
//   dQ[:, c D/2 ..] = dS K[:, c D/2 ..]     (ss, B MN-major, N = D / 2)
//   dK += dS^T Q                            (rs, N = D), while
//   dQ -> shared memory (fragment order) -> the dQ warp's bulk reduce-add.
// A warpgroup whose 64 keys no row of the tile sees (ScoreRules::tile_hidden:
// the causal diagonal) stages a zero dS and runs only its dQ GEMM.
// Deterministic calls add each dQ tile's contributions in key-block order
// (a turn counter per tile, sm90/bulk_turn.cuh); dK and dV never leave the
// CTA's registers before their single store, so they are deterministic anyway.
// The producer warp (sm90/bwd_tma_producer.cuh) loads K and V once, then
// Q, dO, the rows' base-2 lse and dsum of each tile into a two-stage ring.
// lse2, dsum and the dQ accumulator are in padded 64-row tiles
// (sm90/bwd_row_tiles.hpp), written by the preparation kernel
// (sm90/bwd_tma_row_kernels.cuh), which also zeroes the accumulator; the
// conversion kernel turns it into dq. Head dims above 128:
// sm90/flash_bwd_tma_wide_kernel.cuh. The sm80 kernel (sm80/flash_bwd_kernel.cuh) computes the same
// function with mma.sync; its comment has the formulas in full.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/bool_switch.cuh"
#include "common/forward_block.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm90/bulk_turn.cuh"
#include "sm90/bwd_tma_epilogue.cuh"
#include "sm90/bwd_tma_params.cuh"
#include "sm90/bwd_tma_producer.cuh"
#include "sm90/bwd_tma_row_kernels.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/stmatrix.cuh"
#include "sm90/sw128_tile.hpp"
#include "sm90/tma_load.cuh"
#include "sm90/tma_store.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace cuflash::detail::sm90 {

// Query rows per tile: 128 at D = 64 (whose 64-row tiles left the tensor
// pipe idle between short GEMMs: NOTES.md), else 64.
constexpr int tma_bwd_tile_rows(int d) { return d == 64 ? 2 * kBwdTileRows : kBwdTileRows; }

template <typename T, int D_, int BM_ = tma_bwd_tile_rows(D_)>
struct TmaBwdConfig {
  using Element = T;
  static constexpr int D = D_;
  static constexpr int BM = BM_;  // query rows per tile
  static_assert(BM == kBwdTileRows || BM == 2 * kBwdTileRows);
  static constexpr int BN = 128;           // keys per CTA, 64 per consumer warpgroup
  static constexpr int Stages = 2;         // Q / dO / lse / dsum ring
  static constexpr int kThreads = 384;     // producer warpgroup + 2 consumers
  static constexpr int ProducerRegs = 24, ConsumerRegs = 240;
  static_assert(128 * (ProducerRegs + 2 * ConsumerRegs) <= 65536);
  static constexpr int NS = BM / 8;       // n8 blocks of S^T, dP^T per warp
  static constexpr int KS = BM / 16;      // k-steps of dV, dK (queries)
  static constexpr int DT = D / 8;        // n8 blocks of dK, dV
  // dQ = dS K over the block's keys, after both consumers have written dS:
  // with 64-row tiles the consumers split its columns, each D / 2 of them
  // over all 128 keys (at D = 64 a consumer's 32 columns start inside a
  // 128-byte swizzle row of K, which the descriptor's start address
  // handles); with 128-row tiles its rows, each consumer all D columns of
  // its own 64 rows, one padded 64-row tile each (kDqRowSplit).
  static constexpr bool kDqRowSplit = BM == 2 * kBwdTileRows;
  static constexpr int DQ = kDqRowSplit ? D : D / 2;  // dQ columns per consumer
  static constexpr int DQT = DQ / 8;
  using DqOrder = DqTileOrder<D, kDqRowSplit ? 1 : 2>;
  using QTile = Sw128Tile<BM, D>;   // Q, dO: [queries][D]
  using KTile = Sw128Tile<BN, D>;   // K, V: [keys][D]
  using STile = Sw128Tile<BM, BN>;  // dS: [queries][keys]
  static constexpr int kDqBytes = BM * D * 4;  // one dQ tile (128 rows: two padded tiles)
  static constexpr int kDqHalfBytes = kBwdTileRows * D * 4;  // one padded 64-row tile
  static constexpr int DqBuffers = BM == kBwdTileRows ? 2 : 1;  // staged dQ tiles: n % DqBuffers
  static_assert(DqBuffers <= 3, "a dQ warp per buffer: warps 1 .. 3 of the producer warpgroup");
  static constexpr int kStatBytes = BM * 4;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = KTile::kBytes;
  static constexpr int kQOffset = 2 * KTile::kBytes;
  static constexpr int kDoOffset = kQOffset + Stages * QTile::kBytes;
  static constexpr int kDsOffset = kDoOffset + Stages * QTile::kBytes;  // two buffers
  static constexpr int kDqOffset = kDsOffset + 2 * STile::kBytes;
  static constexpr int kLseOffset = kDqOffset + DqBuffers * kDqBytes;  // [Stages][BM]
  static constexpr int kDsumOffset = kLseOffset + Stages * kStatBytes;
  static constexpr int kBarrierOffset = kDsumOffset + Stages * kStatBytes;
  static constexpr int kBarriers = bwd_ring_barriers(Stages);
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per SM");
  static constexpr int kTileBytes = 2 * QTile::kBytes + 2 * kStatBytes;  // one ring stage's loads
  // 64-column block j of stage st's Q, dO (each tile contiguous, block-major).
  __device__ static T* q_block(unsigned char* smem, int st, int j) {
    return reinterpret_cast<T*>(smem + kQOffset + st * QTile::kBytes + j * QTile::kBlockBytes);
  }
  __device__ static T* do_block(unsigned char* smem, int st, int j) {
    return reinterpret_cast<T*>(smem + kDoOffset + st * QTile::kBytes + j * QTile::kBlockBytes);
  }
  // Named barriers: both consumers' dS written (256); K no longer read
  // (256); consumer c's dK/dV staged (128, two); dQ buffer b staged, dQ
  // buffer b free (consumers + the dQ warp, 288; two each).
  static constexpr int kDsReady = 1, kKRead = 2, kKvStaged0 = 3, kDqStaged0 = 5, kDqFree0 = 7;
};

// ---------------------------------------------------------------------------
// Main kernel: grid (key blocks of BN, heads_kv, batch), C::kThreads.
// ---------------------------------------------------------------------------
template <class C, bool Transformed>
__global__ void __launch_bounds__(C::kThreads, 1) flash_bwd_tma_kernel(const __grid_constant__ TmaBackwardParams tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename C::Element;
  constexpr int D = C::D, BM = C::BM, BN = C::BN;
  const BackwardParams& p = tp.p;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  T* sK = reinterpret_cast<T*>(smem + C::kKOffset);
  T* sV = reinterpret_cast<T*>(smem + C::kVOffset);
  auto sQ = [&](int st) { return reinterpret_cast<T*>(smem + C::kQOffset + st * C::QTile::kBytes); };
  auto sDo = [&](int st) { return reinterpret_cast<T*>(smem + C::kDoOffset + st * C::QTile::kBytes); };
  auto sDs = [&](int buf) { return reinterpret_cast<T*>(smem + C::kDsOffset + buf * C::STile::kBytes); };
  auto sDq = [&](int buf) { return reinterpret_cast<float*>(smem + C::kDqOffset + buf * C::kDqBytes); };
  auto sLse = [&](int st) { return reinterpret_cast<float*>(smem + C::kLseOffset + st * C::kStatBytes); };
  auto sDsum = [&](int st) { return reinterpret_cast<float*>(smem + C::kDsumOffset + st * C::kStatBytes); };
  const BwdRing ring = bwd_ring<C>(smem);

  const int tid = threadIdx.x, wg = tid / 128;
  const BwdKeyBlock<BN, BM> blk(tp);
  if (blk.empty()) return;  // varlen: past this sequence's keys (the whole CTA)
  const SeqBounds& seq = blk.seq;
  const BwdWalk& walk = blk.walk;
  const int hk = blk.hk, b = blk.b, n0 = blk.n0;
  const int n_tiles = walk.tiles();

  if (tid == 0) bwd_ring_init<C>(ring, 256);
  __syncthreads();

  if (wg == 0) {
    warpgroup_registers_decrease<C::ProducerRegs>();
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0) {
      bwd_tma_produce<C>(tp, blk, smem, ring, lane);
      return;
    }
    const bool ordered = tp.dq_turn != nullptr;
    // Deterministic calls: a dQ warp per buffer; else one (the default's
    // reductions are never waited on, and its sweep at D = 128 ran 1-2 %
    // slower at 4k-16k keys with two: NOTES.md, "a dQ warp per stage").
    const int dq_warps = ordered ? C::DqBuffers : 1;
    if (warp >= 1 && warp <= dq_warps) {
      // The dQ warps (warp 1 + w takes the tiles n = w, w + dq_warps, ...):
      // each tile's staged dQ (both consumers' halves, in buffer
      // n % DqBuffers) added into the accumulator by one bulk reduction, a
      // buffer released once the reduction that last read it has, so that
      // the consumers stage a tile while the previous one's reduction still
      // reads. Deterministic calls wait for the tile's turn (the key blocks
      // before this one in the order have added), and pass the turn on once
      // the addition is complete: with a warp per buffer, one tile's
      // completion wait does not hold the next tile's reduction.
      for (int n = warp - 1; n < n_tiles; n += dq_warps) {
        const int buf = n % C::DqBuffers;
        if (n >= C::DqBuffers) {
          // (One warp: the reductions of the other buffers may still read.)
          if (lane == 0) {
            if (dq_warps == 1)
              bulk_wait_group_read<C::DqBuffers - 1>();
            else
              bulk_wait_group_read<0>();
          }
          __syncwarp();
        }
        named_barrier_arrive(C::kDqFree0 + buf, 288);
        const std::int64_t row = blk.tile_padded_row(n);
        const int turn = ordered && lane == 0 ? blk.turn(p, n) : 0;
        // Row split: one padded 64-row tile per consumer, the second only
        // where the sequence has rows (past them lies the next sequence's).
        const int parts = C::kDqRowSplit && walk.m0(n) + kBwdTileRows < seq.q_len ? 2 : 1;
        constexpr int kPartBytes = C::kDqRowSplit ? C::kDqHalfBytes : C::kDqBytes;
        named_barrier_sync(C::kDqStaged0 + buf, 288);
        if (lane == 0) {
          for (int c = 0; c < parts; ++c) {
            if (ordered) bulk_turn_wait(tp.dq_turn + row / kBwdTileRows + c, static_cast<std::uint32_t>(turn));
            bulk_reduce_add_f32(tp.dq_accum + (row + c * kBwdTileRows) * D, sDq(buf) + c * (kPartBytes / 4),
                                kPartBytes);
          }
          bulk_commit_group();
          if (ordered) {
            bulk_wait_group<0>();
            for (int c = 0; c < parts; ++c) bulk_turn_pass(tp.dq_turn + row / kBwdTileRows + c);
          }
        }
      }
      if (lane == 0) bulk_wait_group<0>();
    }
    return;
  }

  warpgroup_registers_increase<C::ConsumerRegs>();
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;  // keys [64 cw, 64 cw + 64) of the block
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int key_row = 64 * cw + 16 * warp + g;  // this thread's first key row, within the block

  float dk[C::DT][4], dv[C::DT][4];
  // Whether dK and dV hold a GEMM's result yet: the first GEMM overwrites,
  // and a warpgroup's first tiles (or all) may be hidden (below).
  bool kv_started = false;
  if (n_tiles > 0) {
    // Descriptors: K and V rows of this warpgroup (K-major A); K with the
    // keys as rows (MN-major B of dQ): its columns [cw D/2, ..) over all
    // keys (at D = 64 from the middle of a swizzle row: 32 columns in).
    const std::uint64_t k_desc = sw128_desc(sK + cw * 64 * 64, 16, 1024);
    const std::uint64_t v_desc = sw128_desc(sV + cw * 64 * 64, 16, 1024);
    const std::uint64_t kt_desc =
        sw128_desc(reinterpret_cast<unsigned char*>(sK) +
                       (C::kDqRowSplit ? 0 : cw * C::DQ / 64 * C::KTile::kBlockBytes + cw * C::DQ % 64 * sizeof(T)),
                   C::KTile::kBlockBytes, 1024);
    mbarrier_wait(ring.kv_full, 0);
    int h_rules = -1;
    ScoreRules rules;
    BwdWalkCursor tile(walk);
    for (int n = 0; n < n_tiles; ++n, tile.next()) {
      const int st = n % C::Stages;
      const int h = tile.head(), m0 = tile.m0();
      if (h != h_rules) {
        rules = score_rules(p, seq, b, h);
        h_rules = h;
      }
      const std::uint64_t q_desc = sw128_desc(sQ(st), 16, 1024);
      const std::uint64_t do_desc = sw128_desc(sDo(st), 16, 1024);
      mbarrier_wait(&ring.q_full[st], (n / C::Stages) & 1);
      // This thread's query columns' lse2 (8 i + 2 t4, + 1), read before the
      // GEMMs so that the exponentials do not wait on shared memory; with
      // 128-row tiles (32 more registers) read where they are used.
      constexpr int kLsePrefetch = C::BM == kBwdTileRows ? C::NS : 1;
      float2 lse2[kLsePrefetch];
#pragma unroll
      for (int i = 0; i < kLsePrefetch; ++i) lse2[i] = *reinterpret_cast<const float2*>(sLse(st) + 8 * i + 2 * t4);

      // A tile whose rows see none of this warpgroup's 64 keys (the causal
      // diagonal's first query tile for the upper half of the keys) has P = 0
      // and dS = 0 there: the warpgroup skips its S, dP, dV and dK GEMMs and
      // its exponentials, and stages zeros as its dS for the dQ GEMM.
      const bool hidden = rules.tile_hidden(m0, BM, n0 + 64 * cw, 64);
      std::uint32_t dsa[C::KS][4];
      if (!hidden) {
        // S^T = K Q^T and dP^T = V dO^T, one group each.
        float s[C::NS][4], dp[C::NS][4];
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
          wgmma_ss<T, BM>(s, desc_advance(k_desc, C::KTile::k_major_step_bytes(ks)),
                          desc_advance(q_desc, C::QTile::k_major_step_bytes(ks)), ks > 0);
        wgmma_commit();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks)
          wgmma_ss<T, BM>(dp, desc_advance(v_desc, C::KTile::k_major_step_bytes(ks)),
                          desc_advance(do_desc, C::QTile::k_major_step_bytes(ks)), ks > 0);
        wgmma_commit();

        const bool masked = !rules.tile_unmasked(m0, BM, n0 + 64 * cw, 64) || m0 + BM > seq.q_len;
        wgmma_wait<1>();
        fence_accumulators(s);
        // P^T, packed as the A fragments of dV += P^T dO (pa[kk]: n8 blocks 2 kk
        // and 2 kk + 1, rows g then g + 8, as p_fragments_m16 packs them); s
        // keeps P^T in fp32 for dS, times softcap's factor 1 - tanh^2 where
        // there is one (so that no tanh has to stay live until dS).
        // (The plain kernel compiles it once masked and once not,
        // bool_switch.cuh; softcap / ALiBi's registers allow one copy.)
        std::uint32_t pa[C::KS][4];
        bool_switch<!Transformed>(masked, [&](auto masked_tile) {
          // The rows that see each of this thread's two keys, relative to
          // its first query column (m0 + 2 t4): score (i, e) is seen when
          // 8 i + (e & 1) lies in its key's range, two compares against
          // constants (ScoreRules::key_rows; visible()'s tests per score
          // compiled to ~14 instructions and a branch each).
          // (The transformed kernels keep visible()'s test: with their one
          // copy of this code the ranges stayed live, spills 64 / 68 -> 128 /
          // 140 bytes at D = 64.)
          int seen_lo[2] = {0, 0}, seen_hi[2] = {0, 0};
          if (!Transformed && masked_tile) {
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
              rules.key_rows(n0 + key_row + 8 * kk, seq.q_len, &seen_lo[kk], &seen_hi[kk]);
              seen_lo[kk] -= m0 + 2 * t4;
              seen_hi[kk] -= m0 + 2 * t4;
            }
          }
#pragma unroll
          for (int i = 0; i < C::NS; ++i) {
            [[maybe_unused]] float grad[4] = {1.0f, 1.0f, 1.0f, 1.0f};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              [[maybe_unused]] const int qi = m0 + 8 * i + 2 * t4 + (e & 1);
              [[maybe_unused]] const int key = n0 + key_row + 8 * (e >> 1);
              const float2 row_lse2 =
                  kLsePrefetch == C::NS ? lse2[i % kLsePrefetch]
                                        : *reinterpret_cast<const float2*>(sLse(st) + 8 * i + 2 * t4);
              const float l2 = (e & 1) ? row_lse2.y : row_lse2.x;
              float x;
              if constexpr (Transformed) {
                float th;
                x = sm80::fast_exp2(rules.logit2(s[i][e], qi, key, rules.alibi_log2, &th) - l2);
                grad[e] = ScoreRules::softcap_grad(th);  // 1 without softcap (th = 0)
              } else {
                x = sm80::fast_exp2(fmaf(s[i][e], rules.scale_log2, -l2));
              }
              if constexpr (Transformed) {
                if (masked_tile && !(qi < seq.q_len && rules.visible(qi, key))) x = 0.0f;
              } else {
                const int column = 8 * i + (e & 1);  // qi - (m0 + 2 t4)
                if (masked_tile && !(column >= seen_lo[e >> 1] && column < seen_hi[e >> 1])) x = 0.0f;
              }
              s[i][e] = x;
            }
            pa[i / 2][(i % 2) * 2] = sm80::pack2<T>(s[i][0], s[i][1]);
            pa[i / 2][(i % 2) * 2 + 1] = sm80::pack2<T>(s[i][2], s[i][3]);
            if constexpr (Transformed) {
#pragma unroll
              for (int e = 0; e < 4; ++e) s[i][e] *= grad[e];
            }
          }
          // (Prefetched like lse2, where the registers allow.)
          float2 dsum[kLsePrefetch];
#pragma unroll
          for (int i = 0; i < kLsePrefetch; ++i) dsum[i] = *reinterpret_cast<const float2*>(sDsum(st) + 8 * i + 2 * t4);
          wgmma_wait<0>();  // dP^T done
          fence_accumulators(dp);
          // dS^T = P^T [x (1 - tanh^2)] (dP^T - dsum), into dp. A masked P is
          // exactly 0 and so is its dS, whatever dP (a key or query row past the
          // sequence) holds. In the same block as the exponentials, after dP's
          // wait: ptxas sinks most exponentials below the wait and interleaves
          // them with this loop, so that its FMA-pipe work fills the MUFU
          // pipe's gaps (the exponentials alone are MUFU-bound: NOTES.md).
#pragma unroll
          for (int i = 0; i < C::NS; ++i) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const float2 row_dsum = kLsePrefetch == C::NS
                                          ? dsum[i % kLsePrefetch]
                                          : *reinterpret_cast<const float2*>(sDsum(st) + 8 * i + 2 * t4);
              const float pv = s[i][e];
              float y = pv * (dp[i][e] - ((e & 1) ? row_dsum.y : row_dsum.x));
              if (masked_tile && pv == 0.0f) y = 0.0f;
              dp[i][e] = y;
            }
          }
        });
        p_fragments_m16<T, C::KS>(dp, dsa);

        // dV += P^T dO (B: [queries][D], MN-major), issued only now: a GEMM
        // issued between the exponentials and dS would keep ptxas from
        // interleaving them (above).
        const std::uint64_t do_mn = sw128_desc(sDo(st), C::QTile::kBlockBytes, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < C::KS; ++kk)
          wgmma_rs<T, D, true>(dv, pa[kk], desc_advance(do_mn, C::QTile::mn_major_step_bytes(kk)),
                               kv_started || kk > 0);
        wgmma_commit();
      } else {
#pragma unroll
        for (int kk = 0; kk < C::KS; ++kk) dsa[kk][0] = dsa[kk][1] = dsa[kk][2] = dsa[kk][3] = 0u;
      }

      // dS (queries x keys, this warpgroup's 64 keys) into shared memory:
      // matrices (i, rows g), (i, rows g + 8), (i + 1, ...) of dsa[kk] are
      // queries 16 kk .. 16 kk + 15 of keys key_row - g + [0, 8) and + 8.
      T* ds_tile = sDs(n & 1);
#pragma unroll
      for (int kk = 0; kk < C::KS; ++kk) {
        const int mtx = lane / 8, r = lane % 8;
        const int query = 16 * kk + 8 * (mtx / 2) + r;
        const int key_chunk = (64 * cw + 16 * warp) / 8 + (mtx % 2);
        stmatrix_x4_trans(ds_tile + C::STile::offset(query, key_chunk), dsa[kk]);
      }
      fence_proxy_async_shared();
      named_barrier_sync(C::kDsReady, 256);

      // dQ[:, cw D/2 ..] = dS K[:, cw D/2 ..] (row split: dQ[64 cw .., :] =
      // dS[64 cw .., :] K) over the block's 128 keys, then dK += dS^T Q (B
      // MN-major): dQ is staged for the dQ warp while dK runs.
      float dq[C::DQT][4];
      const std::uint64_t ds_desc =
          sw128_desc(reinterpret_cast<unsigned char*>(ds_tile) + (C::kDqRowSplit ? cw * 64 * 128 : 0), 16, 1024);
      const std::uint64_t q_mn = sw128_desc(sQ(st), C::QTile::kBlockBytes, 1024);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
        wgmma_ss_trans_b<T, C::DQ>(dq, desc_advance(ds_desc, C::STile::k_major_step_bytes(ks)),
                                   desc_advance(kt_desc, C::KTile::mn_major_step_bytes(ks)), ks > 0);
      wgmma_commit();
      if (!hidden) {
#pragma unroll
        for (int kk = 0; kk < C::KS; ++kk)
          wgmma_rs<T, D, true>(dk, dsa[kk], desc_advance(q_mn, C::QTile::mn_major_step_bytes(kk)),
                               kv_started || kk > 0);
        wgmma_commit();
        kv_started = true;
        wgmma_wait<1>();  // dV and dQ done
      } else {
        wgmma_wait<0>();  // dQ done
      }
      fence_accumulators(dq);
      const int dq_buf = n % C::DqBuffers;
      named_barrier_sync(C::kDqFree0 + dq_buf, 288);
#pragma unroll
      for (int i = 0; i < C::DQT; ++i)
        *reinterpret_cast<float4*>(sDq(dq_buf) +
                                   (C::kDqRowSplit ? cw * (C::kDqHalfBytes / 4) + C::DqOrder::block(0, warp, i)
                                                   : C::DqOrder::block(cw, warp, i)) +
                                   lane * 4) =
            make_float4(dq[i][0], dq[i][1], dq[i][2], dq[i][3]);
      fence_proxy_async_shared();
      named_barrier_arrive(C::kDqStaged0 + dq_buf, 288);
      wgmma_wait<0>();  // dK done: Q, dO, lse, dsum of this stage read
      fence_accumulators(dv);
      fence_accumulators(dk);
      mbarrier_arrive(&ring.q_empty[st]);
    }
  }
  if (!kv_started) {
#pragma unroll
    for (int i = 0; i < C::DT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  // Epilogue: dK * softmax_scale and dV as T, staged in this warpgroup's
  // rows of sK / sV (swizzled as loaded: conflict-free), then row chunks
  // stored by the warpgroup. Both warpgroups' dQ GEMMs read all of K, so
  // neither writes sK before both are done.
  named_barrier_sync(C::kKRead, 256);
  bwd_stage_dkdv<typename C::KTile>(sK, sV, dk, dv, key_row, 0, p.softmax_scale, t4);
  named_barrier_sync(C::kKvStaged0 + cw, 128);
  bwd_store_dkdv<typename C::KTile>(p, blk, sK, sV, 64 * cw, 64, 0, D / 8, tid % 128);
#endif
}

}  // namespace cuflash::detail::sm90
