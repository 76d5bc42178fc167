// The order in which the TMA forward's CTAs take their work items: which
// (query block, head, batch x split) the n-th item of a CTA is.
//
// Without a persistent walk (gridDim.x == items) CTA c takes item c and the
// hardware's block scheduler balances the work. A persistent walk (one CTA
// per SM) is static, so it must balance by itself:
// - items of equal cost (no causal mask) go in launch order, query blocks of
//   one head together (head-major), each CTA taking every gridDim.x-th: the
//   CTAs of a round read the same head's K/V, which stays in L2;
// - causal items cost their query block's key tiles. They are sorted by cost
//   (rank-major: every head's heaviest block, then every head's next one;
//   the heads of a round then walk the same key tiles a step apart, so L2
//   still serves them) and dealt out in a snake: round r gives position
//   r G + c to CTA c when r is even and r G + G - 1 - c when r is odd, so
//   a CTA that took a heavy item in one round takes a light one in the
//   next. (A plain stride gave CTA 0 the heaviest block of every head at
//   16k keys and ran 30-45 % slower than one CTA per item.)
#pragma once

namespace cuflash::detail::sm90 {

struct TileOrder {
  int m_blocks = 0;  // query blocks per (batch, head, split)
  int heads = 0;
  int items = 0;  // m_blocks x heads x (batch x splits)
  bool by_cost = false;

  // The position in the item list of CTA `cta`'s n-th item (of `ctas`);
  // at or past `items` when the CTA is done (positions grow with n).
  __device__ __forceinline__ int position(int n, int cta, int ctas) const {
    const int round_start = n * ctas;
    return round_start + (by_cost && (n & 1) ? ctas - 1 - cta : cta);
  }

  // Grid coordinates of the item at `position`: x counts query blocks from
  // the heaviest (forward_block_at reverses it), y is the head, z the
  // batch x split index.
  struct Coords {
    int x, y, z;
  };
  __device__ __forceinline__ Coords coords(int position) const {
    if (by_cost) {
      const int per_rank = items / m_blocks;
      const int rest = position % per_rank;
      return {position / per_rank, rest % heads, rest / heads};
    }
    return {position % m_blocks, (position / m_blocks) % heads, position / (m_blocks * heads)};
  }
};

}  // namespace cuflash::detail::sm90
