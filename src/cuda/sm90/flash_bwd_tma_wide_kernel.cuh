// FlashAttention backward on Hopper for wide heads (D = 256): warp-specialized
// like sm90/flash_bwd_tma_kernel.cuh (the same producer warp and ring,
// sm90/bwd_tma_producer.cuh; the same walk, deterministic order and row
// kernels), but with the head dim split between the two consumer
// warpgroups: dK and dV of 64 keys x 256 columns would take 256 registers
// per thread of one warpgroup, so each holds its half of the columns.
//
// A CTA owns BN = 64 keys of one kv head and walks the 64-row query tiles
// that see them, for every query head of the GQA group. Per query tile,
// consumer warpgroup c (queries as wgmma's M):
//   S_c = Q K_c^T, dP_c = dO V_c^T        (ss, K_c = keys [32 c, 32 c + 32): N = 32)
//   P_c = exp2(logit2 - lse2), dS_c = P_c (dP_c - dsum) [x softcap's factor]
//   P_c, dS_c -> shared memory ([queries][keys], stmatrix); both halves in,
//   dV_c += P^T dO[:, half c]             (ss, A and B MN-major, N = D / 2)
//   dK_c += dS^T Q[:, half c]             (same)
//   dQ_c  = dS K[:, half c]               (ss, B MN-major, N = D / 2)
//   dQ_c -> the stage's half c (below), which the stage's dQ warp adds into
//   the fp32 accumulator with one bulk reduction per half, then frees the stage.
// Shared memory is what bounds this kernel (two stages of Q and dO are 128
// KiB at D = 256), so dQ is staged where the tile's own Q and dO were: a
// stage holds, per half c, Q's and dO's 64-column blocks of half c, 32 KiB,
// exactly one fp32 64 x D/2 dQ half. Once consumer c's dV and dK GEMMs are
// done, nothing reads that half any more (they are its only readers besides
// S and dP, which both consumers finished before P and dS were complete),
// so no further barrier is needed, and the stage goes back to the producer
// when the consumers have arrived on it and the dQ warp's reductions have
// read it.
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
#include "sm90/tma_store.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"

namespace cuflash::detail::sm90 {

template <typename T, int D_>
struct TmaBwdWideConfig {
  using Element = T;
  static constexpr int D = D_;
  static constexpr int BM = kBwdTileRows;  // query rows per tile
  static constexpr int BN = 64;            // keys per CTA, 32 per consumer for S and dP
  static constexpr int Stages = 2;         // Q / dO / lse / dsum ring
  static_assert(Stages <= 3, "a dQ warp per stage: warps 1 .. 3 of the producer warpgroup");
  static constexpr int kThreads = 384;     // producer warpgroup + 2 consumers
  static constexpr int ProducerRegs = 24, ConsumerRegs = 240;
  static_assert(128 * (ProducerRegs + 2 * ConsumerRegs) <= 65536);
  static constexpr int DH = D / 2;  // columns of dK, dV, dQ per consumer
  static_assert(DH % 64 == 0, "each consumer's columns in whole 64-column blocks");
  static constexpr int DHT = DH / 8;  // n8 blocks of them
  static constexpr int KH = BN / 2;   // keys of S, dP per consumer
  static constexpr int KHT = KH / 8;  // n8 blocks of them
  using DqOrder = DqTileOrder<D, 2>;
  using KTile = Sw128Tile<BN, D>;    // K, V: [keys][D]
  using Block = Sw128Tile<BM, 64>;   // one 64-column block of Q or dO
  using PTile = Sw128Tile<BM, BN>;   // P, dS: [queries][keys]
  static constexpr int kHalfBlocks = DH / 64;
  // A stage, per half c: Q's blocks of half c, then dO's.
  static constexpr int kHalfBytes = 2 * kHalfBlocks * Block::kBytes;
  static_assert(kHalfBytes == BM * DH * 4, "a stage's half holds one fp32 dQ half");
  static constexpr int kStageBytes = 2 * kHalfBytes;
  static constexpr int kStatBytes = BM * 4;
  static constexpr int kKOffset = 0;
  static constexpr int kVOffset = KTile::kBytes;
  static constexpr int kStageOffset = 2 * KTile::kBytes;
  static constexpr int kPOffset = kStageOffset + Stages * kStageBytes;  // P, dS: two buffers each
  static constexpr int kDsOffset = kPOffset + 2 * PTile::kBytes;
  static constexpr int kLseOffset = kDsOffset + 2 * PTile::kBytes;  // [Stages][BM]
  static constexpr int kDsumOffset = kLseOffset + Stages * kStatBytes;
  static constexpr int kBarrierOffset = kDsumOffset + Stages * kStatBytes;
  static constexpr int kBarriers = bwd_ring_barriers(Stages);
  static constexpr int kSmemBytes = kBarrierOffset + 8 * kBarriers + 1024;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per SM");
  static constexpr int kTileBytes = 2 * BM * D * static_cast<int>(sizeof(T)) + 2 * kStatBytes;
  // Byte offset, within a stage, of Q's 64-column block j (dO's: + kDoBytes).
  __host__ __device__ static constexpr int q_block_bytes(int j) {
    return (j / kHalfBlocks) * kHalfBytes + (j % kHalfBlocks) * Block::kBytes;
  }
  static constexpr int kDoBytes = kHalfBlocks * Block::kBytes;
  // Of Q's (dO's) ks-th K step of 16 columns, as a K-major operand.
  __host__ __device__ static constexpr std::uint32_t q_k_step_bytes(int ks) {
    return q_block_bytes(ks / 4) + (ks % 4) * 32;
  }
  __device__ static T* q_block(unsigned char* smem, int st, int j) {
    return reinterpret_cast<T*>(smem + kStageOffset + st * kStageBytes + q_block_bytes(j));
  }
  __device__ static T* do_block(unsigned char* smem, int st, int j) {
    return reinterpret_cast<T*>(smem + kStageOffset + st * kStageBytes + q_block_bytes(j) + kDoBytes);
  }
  // Named barriers: both consumers' P and dS written (256); consumer c's
  // dK/dV staged (128, two); stage st's dQ staged (consumers + the dQ warp,
  // 288; one per stage).
  static constexpr int kPdsReady = 1, kKvStaged0 = 2, kDqStaged0 = 4;
};

// ---------------------------------------------------------------------------
// Main kernel: grid (key blocks of BN, heads_kv, batch), C::kThreads.
// ---------------------------------------------------------------------------
template <class C, bool Transformed>
__global__ void __launch_bounds__(C::kThreads, 1)
    flash_bwd_tma_wide_kernel(const __grid_constant__ TmaBackwardParams tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename C::Element;
  constexpr int D = C::D, BM = C::BM, BN = C::BN;
  const BackwardParams& p = tp.p;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  T* sK = reinterpret_cast<T*>(smem + C::kKOffset);
  T* sV = reinterpret_cast<T*>(smem + C::kVOffset);
  auto sHalf = [&](int st, int c) { return smem + C::kStageOffset + st * C::kStageBytes + c * C::kHalfBytes; };
  auto sP = [&](int buf) { return reinterpret_cast<T*>(smem + C::kPOffset + buf * C::PTile::kBytes); };
  auto sDs = [&](int buf) { return reinterpret_cast<T*>(smem + C::kDsOffset + buf * C::PTile::kBytes); };
  auto sLse = [&](int st) { return reinterpret_cast<const float*>(smem + C::kLseOffset + st * C::kStatBytes); };
  auto sDsum = [&](int st) { return reinterpret_cast<const float*>(smem + C::kDsumOffset + st * C::kStatBytes); };
  const BwdRing ring = bwd_ring<C>(smem);

  const int tid = threadIdx.x, wg = tid / 128;
  const BwdKeyBlock<BN, BM> blk(tp);
  if (blk.empty()) return;  // varlen: past this sequence's keys (the whole CTA)
  const SeqBounds& seq = blk.seq;
  const BwdWalk& walk = blk.walk;
  const int hk = blk.hk, b = blk.b, n0 = blk.n0;
  const int n_tiles = walk.tiles();

  // A stage is free again once the consumers are done with it (their reads
  // of lse2 and dsum, their GEMMs, their dQ halves written) and the dQ
  // warp's reductions have read the dQ: 256 + 1 arrivals.
  if (tid == 0) bwd_ring_init<C>(ring, 257);
  __syncthreads();

  if (wg == 0) {
    warpgroup_registers_decrease<C::ProducerRegs>();
    const int warp = tid / 32, lane = tid % 32;
    if (warp == 0) {
      bwd_tma_produce<C>(tp, blk, smem, ring, lane);
      return;
    }
    if (warp >= 1 && warp <= C::Stages) {
      // The dQ warps, one per stage (warp 1 + st takes the tiles of stage
      // st): once both consumers have staged a tile's dQ halves in its
      // stage, one bulk reduction per half into the accumulator; the stage
      // goes back to the producer when they have read it. Deterministic
      // calls wait for the tile's turn first and pass it on once the
      // additions are complete: a wait on completion per tile that one
      // warp serving every stage would hold the next tile's reduction
      // behind (so a stage's warp waits for its own tiles only).
      const bool ordered = tp.dq_turn != nullptr;
      for (int n = warp - 1; n < n_tiles; n += C::Stages) {
        const int st = n % C::Stages;
        const std::int64_t row = blk.tile_padded_row(n);
        const int turn = ordered && lane == 0 ? blk.turn(p, n) : 0;
        named_barrier_sync(C::kDqStaged0 + st, 288);
        if (lane == 0) {
          if (ordered) bulk_turn_wait(tp.dq_turn + row / kBwdTileRows, static_cast<std::uint32_t>(turn));
#pragma unroll
          for (int c = 0; c < 2; ++c)
            bulk_reduce_add_f32(tp.dq_accum + row * D + c * (C::kHalfBytes / 4),
                                reinterpret_cast<const float*>(sHalf(st, c)), C::kHalfBytes);
          bulk_commit_group();
          bulk_wait_group_read<0>();
          mbarrier_arrive(&ring.q_empty[st]);
          if (ordered) {
            bulk_wait_group<0>();
            bulk_turn_pass(tp.dq_turn + row / kBwdTileRows);
          }
        }
        __syncwarp();
      }
      if (lane == 0) bulk_wait_group<0>();
    }
    return;
  }

  warpgroup_registers_increase<C::ConsumerRegs>();
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;  // columns [cw D/2, ..), keys [32 cw, ..) of S and dP
  const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int row_in_tile = 16 * warp + g;  // this thread's first query row of S, dP (and + 8)

  float dk[C::DHT][4], dv[C::DHT][4];
  if (n_tiles > 0) {
    // Descriptors: this consumer's 32 rows of K and V (K-major B of S, dP);
    // K's columns of half cw with the keys as rows (MN-major B of dQ).
    const std::uint64_t k_desc = sw128_desc(sK + cw * C::KH * 64, 16, 1024);
    const std::uint64_t v_desc = sw128_desc(sV + cw * C::KH * 64, 16, 1024);
    const std::uint64_t kt_desc = sw128_desc(sK + cw * C::kHalfBlocks * (C::KTile::kBlockBytes / 2),
                                             C::KTile::kBlockBytes, 1024);
    mbarrier_wait(ring.kv_full, 0);
    int h_rules = -1;
    ScoreRules rules;
    BwdWalkCursor tile(walk);
    for (int n = 0; n < n_tiles; ++n, tile.next()) {
      const int st = n % C::Stages, buf = n & 1;
      const int h = tile.head(), m0 = tile.m0();
      if (h != h_rules) {
        rules = score_rules(p, seq, b, h);
        h_rules = h;
      }
      const std::uint64_t q_desc = sw128_desc(C::q_block(smem, st, 0), 16, 1024);
      const std::uint64_t do_desc = sw128_desc(C::do_block(smem, st, 0), 16, 1024);
      mbarrier_wait(&ring.q_full[st], (n / C::Stages) & 1);

      // S_c = Q K_c^T and dP_c = dO V_c^T, one group each.
      float s[C::KHT][4], dp[C::KHT][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, C::KH>(s, desc_advance(q_desc, C::q_k_step_bytes(ks)),
                           desc_advance(k_desc, C::KTile::k_major_step_bytes(ks)), ks > 0);
      wgmma_commit();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wgmma_ss<T, C::KH>(dp, desc_advance(do_desc, C::q_k_step_bytes(ks)),
                           desc_advance(v_desc, C::KTile::k_major_step_bytes(ks)), ks > 0);
      wgmma_commit();

      const float2 lse2 = make_float2(sLse(st)[row_in_tile], sLse(st)[row_in_tile + 8]);
      const float2 dsum = make_float2(sDsum(st)[row_in_tile], sDsum(st)[row_in_tile + 8]);
      const int key0 = n0 + C::KH * cw;  // this consumer's first key
      const bool masked = !rules.tile_unmasked(m0, BM, key0, C::KH) || m0 + BM > seq.q_len;
      wgmma_wait<1>();
      fence_accumulators(s);
      // P, in s; softcap's factor 1 - tanh^2 (1 without) kept for dS.
      // (The plain kernel compiles this and dS below once masked and once
      // not, bool_switch.cuh.)
      float grad[C::KHT][4];
      bool_switch<!Transformed>(masked, [&](auto masked_tile) {
        // The keys each of this thread's two query rows sees, relative to
        // its first key column (key0 + 2 t4): score (i, e) is seen when
        // 8 i + (e & 1) lies in its row's range, two compares against
        // constants (ScoreRules::row_keys; no key for a row past the
        // sequence's queries).
        int seen_lo[2] = {0, 0}, seen_hi[2] = {0, 0};
        if (masked_tile) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int qi = m0 + row_in_tile + 8 * half;
            rules.row_keys(qi, &seen_lo[half], &seen_hi[half]);
            if (qi >= seq.q_len) seen_hi[half] = seen_lo[half];
            seen_lo[half] -= key0 + 2 * t4;
            seen_hi[half] -= key0 + 2 * t4;
          }
        }
#pragma unroll
        for (int i = 0; i < C::KHT; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            [[maybe_unused]] const int qi = m0 + row_in_tile + 8 * (e >> 1);
            [[maybe_unused]] const int key = key0 + 8 * i + 2 * t4 + (e & 1);
            const float l2 = (e >> 1) ? lse2.y : lse2.x;
            float x;
            grad[i][e] = 1.0f;
            if constexpr (Transformed) {
              float th;
              x = sm80::fast_exp2(rules.logit2(s[i][e], qi, key, rules.alibi_log2, &th) - l2);
              grad[i][e] = ScoreRules::softcap_grad(th);
            } else {
              x = sm80::fast_exp2(fmaf(s[i][e], rules.scale_log2, -l2));
            }
            const int column = 8 * i + (e & 1);  // key - (key0 + 2 t4)
            if (masked_tile && !(column >= seen_lo[e >> 1] && column < seen_hi[e >> 1])) x = 0.0f;
            s[i][e] = x;
          }
        }
      });
      // P and dS as the warp's 16 x 32 fragments; stmatrix stores matrix m
      // (rows 8 (m % 2), keys 8 (m / 2) of a 16 x 16 pair) from the address
      // lane 8 m + r gives.
      auto store_pair = [&](T* tile, const std::uint32_t (&frag)[4], int kk) {
        const int mtx = lane / 8, r = lane % 8;
        stmatrix_x4(tile + C::PTile::offset(16 * warp + 8 * (mtx % 2) + r, (C::KH * cw + 16 * kk) / 8 + mtx / 2), frag);
      };
      std::uint32_t frag[C::KHT / 2][4];
      p_fragments_m16<T, C::KHT / 2>(s, frag);
#pragma unroll
      for (int kk = 0; kk < C::KHT / 2; ++kk) store_pair(sP(buf), frag[kk], kk);

      wgmma_wait<0>();
      fence_accumulators(dp);
      // dS = P [x (1 - tanh^2)] (dP - dsum). A masked P is exactly 0 and so
      // is its dS, whatever dP (a key or query row past the sequence) holds.
      bool_switch<!Transformed>(masked, [&](auto masked_tile) {
#pragma unroll
        for (int i = 0; i < C::KHT; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float y = s[i][e] * grad[i][e] * (dp[i][e] - ((e >> 1) ? dsum.y : dsum.x));
            if (masked_tile && s[i][e] == 0.0f) y = 0.0f;
            dp[i][e] = y;
          }
        }
      });
      p_fragments_m16<T, C::KHT / 2>(dp, frag);
#pragma unroll
      for (int kk = 0; kk < C::KHT / 2; ++kk) store_pair(sDs(buf), frag[kk], kk);
      fence_proxy_async_shared();
      named_barrier_sync(C::kPdsReady, 256);

      // dV_c += P^T dO[:, half], dK_c += dS^T Q[:, half] (A: P, dS with the
      // queries as rows, MN-major; B: this half's blocks, MN-major), then
      // dQ_c = dS K[:, half].
      const std::uint64_t pt_desc = sw128_desc(sP(buf), C::PTile::kBlockBytes, 1024);
      const std::uint64_t dst_desc = sw128_desc(sDs(buf), C::PTile::kBlockBytes, 1024);
      const std::uint64_t do_half = sw128_desc(C::do_block(smem, st, cw * C::kHalfBlocks), C::Block::kBytes, 1024);
      const std::uint64_t q_half = sw128_desc(C::q_block(smem, st, cw * C::kHalfBlocks), C::Block::kBytes, 1024);
      const std::uint64_t ds_desc = sw128_desc(sDs(buf), 16, 1024);
      float dq[C::DHT][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        wgmma_ss_trans_ab<T, C::DH>(dv, desc_advance(pt_desc, C::PTile::mn_major_step_bytes(kk)),
                                    desc_advance(do_half, C::Block::mn_major_step_bytes(kk)), n > 0 || kk > 0);
#pragma unroll
      for (int kk = 0; kk < BM / 16; ++kk)
        wgmma_ss_trans_ab<T, C::DH>(dk, desc_advance(dst_desc, C::PTile::mn_major_step_bytes(kk)),
                                    desc_advance(q_half, C::Block::mn_major_step_bytes(kk)), n > 0 || kk > 0);
#pragma unroll
      for (int ks = 0; ks < BN / 16; ++ks)
        wgmma_ss_trans_b<T, C::DH>(dq, desc_advance(ds_desc, C::PTile::k_major_step_bytes(ks)),
                                   desc_advance(kt_desc, C::KTile::mn_major_step_bytes(ks)), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_accumulators(dv);
      fence_accumulators(dk);
      fence_accumulators(dq);

      // dQ_c into this stage's half cw (fragment order, DqOrder), for the dQ warp.
      float* dq_half = reinterpret_cast<float*>(sHalf(st, cw));
#pragma unroll
      for (int i = 0; i < C::DHT; ++i)
        *reinterpret_cast<float4*>(dq_half + C::DqOrder::block(0, warp, i) + lane * 4) =
            make_float4(dq[i][0], dq[i][1], dq[i][2], dq[i][3]);
      fence_proxy_async_shared();
      named_barrier_arrive(C::kDqStaged0 + st, 288);
      mbarrier_arrive(&ring.q_empty[st]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < C::DHT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[i][e] = dv[i][e] = 0.0f;
  }

  // Epilogue: dK * softmax_scale and dV of this consumer's columns as T,
  // staged in those columns of sK / sV (swizzled as loaded), then stored
  // by the warpgroup. Only this consumer's dQ GEMMs read them, and every
  // S and dP GEMM of both consumers (which read all columns) finished
  // before the last P / dS barrier.
  bwd_stage_dkdv<typename C::KTile>(sK, sV, dk, dv, 16 * warp + g, cw * C::DHT, p.softmax_scale, t4);
  named_barrier_sync(C::kKvStaged0 + cw, 128);
  bwd_store_dkdv<typename C::KTile>(p, blk, sK, sV, 0, BN, cw * C::DHT, C::DHT, tid % 128);
#endif
}

}  // namespace cuflash::detail::sm90
