// The order in which the TMA forward's CTAs take their work items: which
// (query block, head, batch x split) the n-th item of a CTA is.
//
// Without a persistent walk (gridDim.x == items) CTA c takes item c and the
// hardware's block scheduler balances the work. A persistent walk (one CTA
// per SM) is static, so it must balance by itself, and it must keep the
// items that read the same K/V close in time, so that L2 serves them:
// - items of equal cost (no causal mask) go in launch order, query blocks of
//   one head together (head-major), each CTA taking every gridDim.x-th;
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
// every walk takes each item exactly once.
#pragma once

namespace cuflash::detail::sm90 {

struct TileOrder {
  int m_blocks = 0;  // query blocks per (batch, head, split)
  int heads = 0;
  int items = 0;  // m_blocks x heads x (batch x splits)
  bool paired = false;

  // Grid coordinates of an item: x counts query blocks from the heaviest
  // (forward_block_at reverses it), y is the head, z the batch x split
  // index; `exists` is false for the missing second block of an odd
  // head's middle pair.
  struct Item {
    bool more;    // false: the CTA has taken all its items
    bool exists;  // false: skip this one, take the next
    int x, y, z;
  };

  // CTA `cta`'s (of `ctas`) n-th item.
  constexpr Item item(int n, int cta, int ctas) const {
    if (!paired) {
      const int position = cta + n * ctas;
      return {position < items, true, position % m_blocks, (position / m_blocks) % heads,
              position / (m_blocks * heads)};
    }
    const int pairs = (m_blocks + 1) / 2;
    const int unit = cta + (n >> 1) * ctas;  // (pair k, head, batch x split)
    // k rotates with the head: with k = unit % pairs, a CTA count that is a
    // multiple of `pairs` gave every CTA the same k, and an odd head's
    // middle block (half a pair's cost) to the same CTAs in every round.
    const int k = (unit % pairs + unit / pairs) % pairs, second = n & 1;
    const int x = second ? m_blocks - 1 - k : k;
    return {unit < pairs * (items / m_blocks), !(second && x == k), x, (unit / pairs) % heads,
            unit / (pairs * heads)};
  }
};

}  // namespace cuflash::detail::sm90
