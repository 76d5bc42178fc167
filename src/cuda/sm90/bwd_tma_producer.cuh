// The Hopper backward's producer warp and its ring (both main kernels:
// sm90/flash_bwd_tma_kernel.cuh, sm90/flash_bwd_tma_wide_kernel.cuh): K and
// V of the CTA's keys once, then for each query tile of the walk its Q and
// dO (64-column blocks, where the kernel's config C puts them: C::q_block,
// C::do_block), base-2 lse and dsum into stage n % C::Stages of a ring of
// mbarrier-guarded stages.
#pragma once

#include <cstdint>

#include "common/score_mask.cuh"
#include "sm90/bwd_tma_params.cuh"
#include "sm90/mbarrier.cuh"
#include "sm90/sw128_tile.hpp"
#include "sm90/tma_load.cuh"
#include "sm90/wgmma.cuh"

namespace cuflash::detail::sm90 {

// The ring's mbarriers, 2 + 2 C::Stages of them at C::kBarrierOffset: K and
// V landed; stage st's loads landed (q_full) and its buffers free again
// (q_empty: `empty_arrivals` arrivals, from whoever reads the stage last);
// a varlen tail's bytes landed, before the warp zeroes its rows.
constexpr int bwd_ring_barriers(int stages) { return 2 + 2 * stages; }
struct BwdRing {
  std::uint64_t* kv_full;
  std::uint64_t* q_full;
  std::uint64_t* q_empty;
  std::uint64_t* landed;
};
template <class C>
__device__ __forceinline__ BwdRing bwd_ring(unsigned char* smem) {
  auto* base = reinterpret_cast<std::uint64_t*>(smem + C::kBarrierOffset);
  return {base, base + 1, base + 1 + C::Stages, base + 1 + 2 * C::Stages};
}
template <class C>
__device__ __forceinline__ void bwd_ring_init(const BwdRing& ring, int empty_arrivals) {
  mbarrier_init(ring.kv_full, 1);
  mbarrier_init(ring.landed, 1);
#pragma unroll
  for (int st = 0; st < C::Stages; ++st) {
    mbarrier_init(&ring.q_full[st], 1);
    mbarrier_init(&ring.q_empty[st], empty_arrivals);
  }
  mbarrier_init_fence();
}

// The producer warp: lane 0 issues every load; the whole warp zeroes varlen
// tails.
template <class C>
__device__ __forceinline__ void bwd_tma_produce(const TmaBackwardParams& tp, const BwdKeyBlock<C::BN, C::BM>& blk,
                                                unsigned char* smem, const BwdRing& ring, int lane) {
  using T = typename C::Element;
  using QBlock = Sw128Tile<C::BM, 64>;
  const SeqBounds& seq = blk.seq;
  const BwdWalk& walk = blk.walk;
  const int n0 = blk.n0, hk = blk.hk, batch_coord = blk.batch_coord;
  const int n_tiles = walk.tiles();
  if (n_tiles == 0) return;
  const bool varlen = tp.p.cu_seqlens_q != nullptr;
  const bool leader = lane == 0;
  // Lanes 1-31 only help with varlen tails. In a dense call they leave:
  // walking along with lane 0 (every load and wait skipped), they ran
  // ahead in turns of their own while lane 0 waited for a ring stage (the
  // forward producer's pattern, NOTES.md session 48).
  if (!varlen && !leader) return;
  T* sK = reinterpret_cast<T*>(smem + C::kKOffset);
  T* sV = reinterpret_cast<T*>(smem + C::kVOffset);
  // A varlen tile that runs past its sequence holds the next sequence's
  // rows, or rows no sequence owns (possibly NaN): masked P and dS are
  // exactly 0, but dQ = dS K, dK += dS^T Q and dV += P^T dO multiply them by
  // those rows, and 0 x NaN is NaN. So such rows of K, V, Q and dO are
  // zeroed before the consumers see the tile: the TMA bytes land on
  // `landed` instead, the warp zeroes, then releases the full barrier.
  // (Dense tensors end at the sequence: TMA fills zeros.)
  std::uint32_t tails = 0;
  auto release_tail = [&](std::uint64_t* full) {
    // The zeros are generic-proxy writes that wgmma reads through the async
    // proxy; then the warp's writes before lane 0's arrival.
    fence_proxy_async_shared();
    __syncwarp();
    if (leader) mbarrier_arrive(full);
  };
  const int k_rows = seq.k_len - n0;
  const bool k_tail = varlen && k_rows < C::BN;
  if (leader) {
    tma_prefetch_map(&tp.q);
    tma_prefetch_map(&tp.dout);
    std::uint64_t* bar = k_tail ? ring.landed : ring.kv_full;
    mbarrier_arrive_expect_tx(bar, 2 * C::KTile::kBytes);
#pragma unroll
    for (int c = 0; c < C::KTile::kBlocks; ++c) {
      tma_load_4d(sK + c * (C::KTile::kBlockBytes / 2), &tp.k, bar, c * 64, seq.k_start + n0, hk, batch_coord);
      tma_load_4d(sV + c * (C::KTile::kBlockBytes / 2), &tp.v, bar, c * 64, seq.k_start + n0, hk, batch_coord);
    }
  }
  if (k_tail) {
    mbarrier_wait(ring.landed, tails++ & 1);
    C::KTile::zero_rows_from(sK, k_rows, lane);
    C::KTile::zero_rows_from(sV, k_rows, lane);
    release_tail(ring.kv_full);
  }
  for (int n = 0; n < n_tiles; ++n) {
    const int st = n % C::Stages;
    const int h = walk.head(n), m0 = walk.m0(n);
    const int q_rows = seq.q_len - m0;
    const bool q_tail = varlen && q_rows < C::BM;
    if (leader) {
      mbarrier_wait(&ring.q_empty[st], ((n / C::Stages) & 1) ^ 1);
      std::uint64_t* bar = q_tail ? ring.landed : &ring.q_full[st];
      mbarrier_arrive_expect_tx(bar, C::kTileBytes);
#pragma unroll
      for (int c = 0; c < C::D / 64; ++c) {
        tma_load_4d(C::q_block(smem, st, c), &tp.q, bar, c * 64, seq.q_start + m0, h, batch_coord);
        tma_load_4d(C::do_block(smem, st, c), &tp.dout, bar, c * 64, seq.q_start + m0, h, batch_coord);
      }
      const std::int64_t row = blk.tile_padded_row(n);
      bulk_load(smem + C::kLseOffset + st * C::kStatBytes, tp.lse2 + row, C::kStatBytes, bar);
      bulk_load(smem + C::kDsumOffset + st * C::kStatBytes, tp.dsum + row, C::kStatBytes, bar);
    }
    if (q_tail) {
      mbarrier_wait(ring.landed, tails++ & 1);
#pragma unroll
      for (int c = 0; c < C::D / 64; ++c) {
        QBlock::zero_rows_from(C::q_block(smem, st, c), q_rows, lane);
        QBlock::zero_rows_from(C::do_block(smem, st, c), q_rows, lane);
      }
      release_tail(&ring.q_full[st]);
    }
  }
}

}  // namespace cuflash::detail::sm90
