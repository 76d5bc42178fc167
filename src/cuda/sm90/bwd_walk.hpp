// The Hopper backward's walk (sm90/flash_bwd_tma_kernel.cuh): which query
// tiles the CTA of a key block visits, and in deterministic calls, how many
// key blocks add into a query tile's dQ before a given one. Host and device,
// so that the order's rules (every tile's adders numbered 0, 1, ... in one
// direction; each CTA waits only on CTAs launched before it) are checked on
// the host over many shapes (tests/cpu/bwd_walk_test.cpp).
#pragma once

#include <cstdint>

#include "common/rows_seeing.hpp"
#include "host_device.hpp"
#include "sm90/bwd_row_tiles.hpp"

namespace cuflash::detail::sm90 {

// The query tiles a CTA walks: heads h0 .. h0 + group - 1, each over tiles
// m_lo .. m_end - 1 of tile_rows rows (a multiple of kBwdTileRows). Every
// role of the CTA walks the same sequence.
struct BwdWalk {
  int m_lo = 0, m_end = 0, h0 = 0, group = 1, tile_rows = kBwdTileRows;
  CUFLASH_HOST_DEVICE int tiles() const { return (m_end - m_lo) * group; }
  CUFLASH_HOST_DEVICE int head(int n) const { return h0 + n / (m_end - m_lo); }
  CUFLASH_HOST_DEVICE int m0(int n) const { return (m_lo + n % (m_end - m_lo)) * tile_rows; }
};

// The same walk visited in order, without BwdWalk::head / m0's division by a
// run-time count per tile (a dozen instructions on the consumers' chain):
// tile n's head and first row after n calls of next().
struct BwdWalkCursor {
  int h, m_tile, m_lo, m_end, tile_rows;
  CUFLASH_HOST_DEVICE explicit BwdWalkCursor(const BwdWalk& w)
      : h(w.h0), m_tile(w.m_lo), m_lo(w.m_lo), m_end(w.m_end), tile_rows(w.tile_rows) {}
  CUFLASH_HOST_DEVICE int head() const { return h; }
  CUFLASH_HOST_DEVICE int m0() const { return m_tile * tile_rows; }
  CUFLASH_HOST_DEVICE void next() {
    if (++m_tile == m_end) {
      m_tile = m_lo;
      ++h;
    }
  }
};

// The walk of keys [n0, n1) of kv head hk, whose query heads are hk * group ..
CUFLASH_HOST_DEVICE BwdWalk bwd_walk(const KeyVisibility& v, int n0, int n1, int hk, int group,
                                     int tile_rows = kBwdTileRows) {
  BwdWalk w;
  std::int64_t lo, hi;
  query_rows_seeing(v, n0, n1, &lo, &hi);
  w.group = group;
  w.h0 = hk * group;
  w.tile_rows = tile_rows;
  if (lo < hi) {
    w.m_lo = static_cast<int>(lo / tile_rows);
    w.m_end = static_cast<int>((hi + tile_rows - 1) / tile_rows);
  }
  return w;
}

// Deterministic order: how many blocks (of `block_keys` keys, k_len keys in
// all) add into query tile `m_tile` before block j does, which reaches it:
// those after j that reach it (descending) or those before j (ascending).
// The blocks that reach a tile are consecutive, so a binary search over the
// walks themselves finds the end of the run: the count cannot disagree with
// the walks the other CTAs take.
CUFLASH_HOST_DEVICE int bwd_blocks_before(const KeyVisibility& v, int k_len, int block_keys, int m_tile, int j,
                                          bool descending, int tile_rows = kBwdTileRows) {
  auto reaches = [&](int block) {
    const int n0 = block * block_keys;
#if defined(__CUDA_ARCH__)
    const int n1 = min(n0 + block_keys, k_len);
#else
    const int n1 = n0 + block_keys < k_len ? n0 + block_keys : k_len;
#endif
    const BwdWalk w = bwd_walk(v, n0, n1, 0, 1, tile_rows);
    return w.m_lo <= m_tile && m_tile < w.m_end;
  };
  if (descending) {
    int lo = j, hi = (k_len + block_keys - 1) / block_keys - 1;  // the last block reaching the tile
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (reaches(mid))
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo - j;
  }
  int lo = 0, hi = j;  // the first block reaching the tile
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (reaches(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return j - lo;
}

}  // namespace cuflash::detail::sm90
