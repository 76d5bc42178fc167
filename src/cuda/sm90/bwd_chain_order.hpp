// The Hopper backward's launch order of key blocks in deterministic calls
// without a right bound (sm90/bwd_tma_params.cuh): which (chain, key block)
// the CTA at a given place of the launch order owns. A chain is one (batch,
// kv head): its key blocks add into the same dQ tiles, in ascending block
// order (sm90/bwd_walk.hpp), each waiting for the one before it.
//
// Why not the grid's own order (key blocks fastest): every walk then starts
// at query tile 0, so the co-resident blocks of a chain reach each tile in
// the same step and the turns serialize them, one hand-over apart; with the
// next block of a chain launched only 1/132 of a walk after the one before
// it, that lag is never made up (deterministic / default 0.81-0.84 at
// D = 256 and 512-2k keys, NOTES.md session 25). Interleaving the blocks of
// `interleave` chains (block j of chains c .. c + interleave - 1, then block
// j + 1 of them, ...) launches consecutive blocks of one chain `interleave`
// CTAs apart, so each starts that much later than the one it waits for. A
// group of chains is kept small enough that its rows stay in L2
// (bwd_chain_interleave). A block still waits only on blocks launched
// before it: (chain, j - 1) comes earlier in the order than (chain, j).
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail::sm90 {

struct BwdChainOrder {
  int key_blocks = 1;  // per chain (the grid's x)
  int chains = 1;      // batch x kv heads
  int interleave = 1;  // chains per group; 1: the grid's order

  // The chain and key block of the CTA at place `linear` of the launch
  // order (0 .. key_blocks x chains - 1).
  CUFLASH_HOST_DEVICE void at(std::int64_t linear, int* chain, int* key_block) const {
    const std::int64_t group_size = static_cast<std::int64_t>(interleave) * key_blocks;
    const int group = static_cast<int>(linear / group_size);
    const int in_group = static_cast<int>(linear - group * group_size);
    const int first = group * interleave;
    // The last group may hold fewer chains.
    const int width = chains - first < interleave ? chains - first : interleave;
    *key_block = in_group / width;
    *chain = first + in_group % width;
  }
};

// Chains per group for a call whose chains each have `chain_bytes` of
// per-row data that every key block of the chain reads or adds into (Q, dO,
// lse2, dsum, the fp32 dQ accumulator): as many as fit half of an H100's /
// H200's 50 MB L2 (at most `chains`, at least 1), since about 1.5 groups'
// worth is in flight when one group's blocks end and the next's begin. A
// walk's time grows with its chain's bytes as the group's size shrinks
// with them, so the next block of a chain starts about the same time after
// its predecessor at every length: ~4 us at D = 256 (a hand-over is ~2 us).
inline int bwd_chain_interleave(std::int64_t chain_bytes, int chains) {
  constexpr std::int64_t kL2Budget = std::int64_t{24} << 20;
  if (chain_bytes <= 0 || chains <= 1) return 1;
  const std::int64_t fit = kL2Budget / chain_bytes;
  return static_cast<int>(fit < 1 ? 1 : fit > chains ? chains : fit);
}

}  // namespace cuflash::detail::sm90
