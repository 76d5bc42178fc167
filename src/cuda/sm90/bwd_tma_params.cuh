// What the Hopper backward's kernels share (sm90/flash_bwd_tma_kernel.cuh:
// 64- and 128-row query tiles; sm90/flash_bwd_tma_wide_kernel.cuh: head
// dims split between the consumers): their parameters, the walk of a key
// block, the deterministic order's direction and where a query tile's rows
// are in the padded per-row data (sm90/bwd_row_tiles.hpp).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/score_mask.cuh"
#include "sm90/bwd_chain_order.hpp"
#include "sm90/bwd_row_tiles.hpp"
#include "sm90/bwd_walk.hpp"

namespace cuflash::detail::sm90 {

struct TmaBackwardParams {
  BackwardParams p;
  CUtensorMap q, k, v, dout;
  // Padded rows (bwd_row_tiles.hpp), [heads_q][padded_rows] and
  // [heads_q][padded_rows][D]: written by the preparation kernel.
  float* lse2 = nullptr;  // base-2 lse; +inf for a row that sees no key
  float* dsum = nullptr;
  float* dq_accum = nullptr;
  std::int64_t padded_rows = 0;
  // Deterministic calls: one turn counter per dQ tile ([heads_q][padded_rows
  // / 64], zeroed by the preparation kernel), so that the key blocks add into
  // a tile one after another in block order (sm90/bulk_turn.cuh). Null: any order.
  std::uint32_t* dq_turn = nullptr;
  // Chains (batch x kv head) whose key blocks are launched interleaved
  // (sm90/bwd_chain_order.hpp); 1: the grid's order.
  int chain_interleave = 1;
};

// The walk of keys [n0, n1) of kv head hk (sm90/bwd_walk.hpp).
template <int BM>
__device__ __forceinline__ BwdWalk bwd_walk(const BackwardParams& p, const SeqBounds& seq, int n0, int n1, int hk) {
  return bwd_walk(key_visibility(p, seq), n0, n1, hk, p.group, BM);
}

// Deterministic order (sm90/bwd_walk.hpp counts the turns). With a right
// bound (causal or a window), block j's walk starts at a later query tile
// the larger j is, so the blocks add into a tile from the last one that
// reaches it down to the first, and the grid is walked in reverse
// (blockIdx.x 0 is the last block): every CTA then waits only on CTAs
// launched before it (no deadlock however many blocks a head has), and a
// block reaches each tile after the one before it in the order (no waiting
// when they start together). Without a right bound every walk starts at
// tile 0: the blocks add in ascending order, and the key blocks of several
// chains are launched interleaved (sm90/bwd_chain_order.hpp), so that a
// block starts well after the one it waits for.
__device__ __forceinline__ bool bwd_blocks_descending(const BackwardParams& p) {
  return p.deterministic && p.window_right >= 0;
}

// Padded row (bwd_row_tiles.hpp) of row m0 of sequence b, query head h:
// where its lse2 and dsum are, and D times it, its dQ tile.
__device__ __forceinline__ std::int64_t bwd_padded_row(const TmaBackwardParams& tp, const SeqBounds& seq, int b,
                                                       int h, int m0) {
  const BackwardParams& p = tp.p;
  const std::int64_t q_start =
      p.cu_seqlens_q != nullptr ? static_cast<std::int64_t>(seq.q_start) : static_cast<std::int64_t>(b) * p.max_q_len;
  return static_cast<std::int64_t>(h) * tp.padded_rows + bwd_padded_start(q_start, b) + m0;
}

// The key block a CTA of either main kernel owns (grid: key blocks of BN,
// heads_kv, batch) and the query tiles (BM rows) it walks.
template <int BN, int BM>
struct BwdKeyBlock {
  SeqBounds seq;
  int hk = 0, b = 0;
  int key_block = 0;  // in the deterministic order's numbering (the grid reversed if descending)
  int n0 = 0, n1 = 0;  // keys [n0, n1) of the sequence; n0 >= k_len: none (varlen)
  int batch_coord = 0;  // the TMA maps' batch coordinate
  BwdWalk walk;
  std::int64_t padded0 = 0, padded_rows = 0;  // head 0, row 0's padded row; rows per head

  __device__ __forceinline__ BwdKeyBlock(const TmaBackwardParams& tp) {
    const BackwardParams& p = tp.p;
    hk = blockIdx.y;
    b = blockIdx.z;
    key_block = bwd_blocks_descending(p) ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    if (tp.chain_interleave > 1 && !bwd_blocks_descending(p)) {
      // The CTA's place in the launch order (x fastest, then y, then z), as
      // the interleaved order reads it (the plan only asks for it with
      // ascending turns).
      const BwdChainOrder order{static_cast<int>(gridDim.x), static_cast<int>(gridDim.y * gridDim.z),
                                tp.chain_interleave};
      int chain = 0;
      order.at(blockIdx.x + static_cast<std::int64_t>(gridDim.x) * (blockIdx.y + gridDim.y * blockIdx.z), &chain,
               &key_block);
      hk = chain % gridDim.y;
      b = chain / gridDim.y;
    }
    seq = seq_bounds(p, b);
    n0 = key_block * BN;
    if (!empty()) {
      n1 = min(n0 + BN, seq.k_len);
      walk = bwd_walk<BM>(p, seq, n0, n1, hk);
    }
    batch_coord = p.cu_seqlens_q != nullptr ? 0 : b;
    padded0 = bwd_padded_row(tp, seq, b, 0, 0);
    padded_rows = tp.padded_rows;
  }
  // Past this sequence's keys (varlen): the whole CTA has nothing to do.
  __device__ __forceinline__ bool empty() const { return n0 >= seq.k_len; }
  // The padded row of the n-th query tile of the walk (its lse2, dsum; D
  // times it, its dQ tile): bwd_padded_row with the sequence's part once.
  __device__ __forceinline__ std::int64_t tile_padded_row(int n) const {
    return static_cast<std::int64_t>(walk.head(n)) * padded_rows + padded0 + walk.m0(n);
  }
  // Deterministic calls: how many key blocks add into the n-th tile before
  // this one (sm90/bwd_walk.hpp).
  __device__ __forceinline__ int turn(const BackwardParams& p, int n) const {
    return bwd_blocks_before(key_visibility(p, seq), seq.k_len, BN, walk.m0(n) / BM, key_block,
                             bwd_blocks_descending(p), BM);
  }
};

}  // namespace cuflash::detail::sm90
