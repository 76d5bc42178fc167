// The host-side plan of backend cuda's KV-cache kernel, pinned down without a
// GPU (sm80/flash_decode_tiles.hpp is plain C++): shared memory per head dim
// against the H100 and A100 limits, the m-tile choice, and the split rule on
// issue 5's shapes.
#include <gtest/gtest.h>

#include "sm80/flash_decode_tiles.hpp"
#include "sm80/head_dims.hpp"

namespace cuflash::detail::sm80 {
namespace {

constexpr int kA100OptInBytes = 163 * 1024;      // per block
constexpr int kH100SmBytes = 228 * 1024;         // per SM, of which 1 KiB per CTA is reserved

TEST(DecodePlan, EveryShapeFitsAnA100Block) {
  for (int d : kHeadDims)
    for (int m = 1; m <= decode_tile(d).max_m_tiles; ++m) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", m tiles " + std::to_string(m));
      EXPECT_LE(decode_smem_bytes(d, m, 2), kA100OptInBytes);
      EXPECT_GE(decode_tile(d).stages, 2);
    }
}

// The wide CTA: a warp per head, its heads' rows of a key fill 1-2 KiB, and
// it fits an A100 block too.
TEST(DecodePlan, WideShapes) {
  for (int d : kHeadDims) {
    const int heads = decode_wide_heads(d);
    if (heads == 0) continue;
    SCOPED_TRACE("head_dim " + std::to_string(d));
    const DecodeShape shape = decode_shape(d, true);
    EXPECT_EQ(shape.warps, heads);
    EXPECT_EQ(shape.block_n, 16);  // the k extent of one P V mma per warp
    EXPECT_GE(heads * d * 2, 1024);
    EXPECT_LE(heads * d * 2, 2048);
    EXPECT_LE(decode_smem_bytes(d, 1, 2, true), kA100OptInBytes);
  }
  EXPECT_EQ(decode_wide_heads(96), 0);  // 12 chunks per row do not tile the CTA
  EXPECT_EQ(decode_shape(128, false).heads, 1);
  EXPECT_EQ(decode_shape(128, false).block_n, 64);
}

// Two CTAs per H100 SM up to D=128 (more loads in flight, overlapping prologues).
TEST(DecodePlan, TwoCtasPerH100SmUpToD128) {
  for (int d : {32, 64, 96, 128})
    for (int m = 1; m <= 2; ++m)
      EXPECT_LE(2 * (decode_smem_bytes(d, m, 2) + 1024), kH100SmBytes) << "head_dim " << d << ", m tiles " << m;
}

TEST(DecodePlan, MTilesFollowTheRows) {
  EXPECT_EQ(decode_m_tiles(128, 4), 1);    // GQA 4 x 1 query
  EXPECT_EQ(decode_m_tiles(128, 16), 1);
  EXPECT_EQ(decode_m_tiles(128, 17), 2);   // two m16 tiles, one row block
  EXPECT_EQ(decode_m_tiles(256, 64), 1);   // registers: row blocks of 16
}

// H100: 132 SMs x 2 CTAs (D=128). tiles: 64-key tiles of the cache, +1.
TEST(DecodePlan, SplitsOnIssueShapes) {
  constexpr long long kSlots = 132 * 2;
  const auto tiles = [](long long kv_len) { return (kv_len + 63) / 64 + 1; };
  EXPECT_EQ(decode_splits(1 * 8, kSlots, tiles(4096)), 32);     // B=1, 32/8, 4k: 33 by slots, 32 by tiles
  EXPECT_EQ(decode_splits(1 * 8, kSlots, tiles(131072)), 33);   // B=1, 32/8, 128k: one wave
  EXPECT_EQ(decode_splits(1 * 32, kSlots, tiles(4096)), 8);     // B=1, MHA 32/32
  EXPECT_EQ(decode_splits(8 * 8, kSlots, tiles(4096)), 4);      // B=8, 32/8
  EXPECT_EQ(decode_splits(8 * 32, kSlots, tiles(4096)), 1);     // B=8, MHA: 256 CTAs fill the slots
  EXPECT_EQ(decode_splits(64 * 8, kSlots, tiles(4096)), 1);     // B=64
  EXPECT_EQ(decode_splits(1 * 8, kSlots, tiles(1024)), 8);      // short cache: two tiles per split
  EXPECT_EQ(decode_splits(1 * 8, kSlots, tiles(0)), 1);         // empty caches
  EXPECT_EQ(decode_splits(1, 4 * 132, tiles(1 << 20)), 64);     // capped at 64
}

// Wide (D=128): one CTA per SM, a CTA per (sequence, 8 kv heads), 16-key
// tiles. The host picks it only for grids that need no split; forced
// (CUFLASH_DECODE_CTA=wide) on small ones, it splits like the per-head CTA.
TEST(DecodePlan, WideSplitsOnIssueShapes) {
  constexpr long long kSlots = 132;
  const auto tiles = [](long long kv_len) { return (kv_len + 15) / 16 + 1; };
  EXPECT_EQ(decode_splits(1, kSlots, tiles(4096)), 64);      // B=1, 32/8: 132 by slots, capped
  EXPECT_EQ(decode_splits(1, kSlots, tiles(80)), 3);         // two tiles per split
  EXPECT_EQ(decode_splits(8, kSlots, tiles(4096)), 16);      // B=8, 32/8
  EXPECT_EQ(decode_splits(64, kSlots, tiles(4096)), 2);      // B=64
  EXPECT_EQ(decode_splits(128, kSlots, tiles(4096)), 1);     // B=128 fills the slots
}

TEST(DecodePlan, SplitsNeverShrinkAsTheCacheGrows) {
  for (long long ctas : {1, 3, 8, 32, 100, 211, 300})
    for (long long tiles = 0; tiles < 300; ++tiles)
      EXPECT_LE(decode_splits(ctas, 264, tiles), decode_splits(ctas, 264, tiles + 1)) << ctas << " " << tiles;
}

}  // namespace
}  // namespace cuflash::detail::sm80
