// The order in which the TMA forward's CTAs take their work items: which
// (query block, head, batch x split) the n-th item of a CTA is.
//
// Without a persistent walk (gridDim.x == items) CTA c takes item c and the
// hardware's block scheduler balances the work. A persistent walk (one CTA
// per SM) is static, so it must balance by itself, and it must keep the
// items that read the same K/V close in time, so that L2 serves them:
// - items without a causal mask go in launch order, query blocks of one
//   head together (head-major), each CTA taking every gridDim.x-th, with a
//   head's blocks rotated by the round its first block falls in: the last
//   block of a head is partial where BM does not divide the length, and
//   without the rotation a CTA count that is a multiple of the block count
//   gave every CTA the same block in every round (D = 64 at 512 keys: three
//   192-row blocks, 132 CTAs; a third of the CTAs always took the 128-row
//   block, 13 % faster per item, and the kernel waited for the others:
//   step timeline, NOTES.md session 44);
// - causal items cost their query block's key tiles, the heaviest block of
//   a head m times the lightest. They go in pairs, a head's k-th heaviest
//   block with its k-th lightest, which together cost the same for every k;
//   the pairs go head-major, each CTA taking every gridDim.x-th pair and
//   computing both of its blocks. (A plain stride over blocks gave CTA 0 the
//   heaviest block of every head at 16k keys, 30-45 % slower than one CTA
//   per item; blocks sorted by cost across heads balanced, but then a
//   round of CTAs read every head's K/V and each block read it from HBM
//   again: 6-16 % slower, NOTES.md.)
//
// Plain C++ (constexpr, which device code calls under
// --expt-relaxed-constexpr), so tests/cpu/tile_order_test.cpp checks that
// every walk takes each item exactly once. Its divisions are by counts fixed
// per launch, so they go through FastDivisor: each CTA role computes an
// item's coordinates per item, and a run-time division's dependent chain
// was ~20 instructions of the producer's way to its first load.
#pragma once

#include "common/fast_divisor.hpp"

namespace cuflash::detail::sm90 {

struct TileOrder {
  int m_blocks = 0;  // query blocks per (batch, head, split)
  int heads = 0;
  int items = 0;  // m_blocks x heads x (batch x splits)
  bool paired = false;
  int pairs = 0;       // (m_blocks + 1) / 2
  int pair_units = 0;  // pairs x heads x (batch x splits): what a paired walk deals out
  FastDivisor by_m_blocks, by_heads, by_pairs, by_ctas;

  // ctas: the grid (the walk's stride); item() must be called with it.
  static constexpr TileOrder make(int m_blocks, int heads, int items, bool paired, int ctas) {
    TileOrder order;
    order.by_ctas = FastDivisor(static_cast<unsigned>(ctas > 0 ? ctas : 1));
    order.m_blocks = m_blocks;
    order.heads = heads;
    order.items = items;
    order.paired = paired;
    order.pairs = (m_blocks + 1) / 2;
    order.pair_units = m_blocks > 0 ? order.pairs * (items / m_blocks) : 0;
    order.by_m_blocks = FastDivisor(static_cast<unsigned>(m_blocks > 0 ? m_blocks : 1));
    order.by_heads = FastDivisor(static_cast<unsigned>(heads > 0 ? heads : 1));
    order.by_pairs = FastDivisor(static_cast<unsigned>(order.pairs > 0 ? order.pairs : 1));
    return order;
  }

  // Grid coordinates of an item: x counts query blocks from the heaviest
  // (forward_block_at reverses it), y is the head, z the batch x split
  // index; `exists` is false for the missing second block of an odd
  // head's middle pair.
  struct Item {
    bool more;    // false: the CTA has taken all its items
    bool exists;  // false: skip this one, take the next
    int x, y, z;
  };

  // CTA `cta`'s (of `ctas`, the count make() was given) n-th item.
  constexpr Item item(int n, int cta, int ctas) const {
    if (!paired) {
      const int position = cta + n * ctas;
      const int head_major = by_m_blocks.div(position);  // position / m_blocks
      // The head's blocks rotated by the round of its first block (a
      // function of the head alone, so the walk still takes each item
      // once); where ctas is a multiple of m_blocks that round is n, and a
      // CTA's block moves by one each round.
      const int head_start = head_major * m_blocks;
      const int rotated = position - head_start + by_ctas.div(head_start);
      const int x = rotated - by_m_blocks.div(rotated) * m_blocks;
      const int z = by_heads.div(head_major);
      return {position < items, true, x, head_major - z * heads, z};
    }
    const int unit = cta + (n >> 1) * ctas;  // (pair k, head, batch x split)
    const int head_major = by_pairs.div(unit);  // unit / pairs
    // k rotates with the head: with k = unit % pairs, a CTA count that is a
    // multiple of `pairs` gave every CTA the same k, and an odd head's
    // middle block (half a pair's cost) to the same CTAs in every round.
    const int rotated = unit - head_major * pairs + head_major;
    const int k = rotated - by_pairs.div(rotated) * pairs, second = n & 1;
    const int x = second ? m_blocks - 1 - k : k;
    const int z = by_heads.div(head_major);
    return {unit < pair_units, !(second && x == k), x, head_major - z * heads, z};
  }
};

}  // namespace cuflash::detail::sm90
