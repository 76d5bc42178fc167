// The TMA forward's walk order (src/cuda/sm90/tile_order.hpp), on the host:
// every CTA count takes each work item exactly once, and the causal pairs
// cost the same (a block's cost: its key tiles under a square causal mask).
#include "sm90/tile_order.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace {

using cuflash::detail::sm90::TileOrder;

struct WalkShape {
  int m_blocks, heads, z, ctas;
  bool paired;
};

// Visits of every (x, y, z) by every CTA's walk; items per CTA in order.
std::vector<int> visits(const TileOrder& order, int ctas, std::vector<std::vector<int>>* per_cta = nullptr) {
  std::vector<int> seen(order.items, 0);
  if (per_cta) per_cta->assign(ctas, {});
  for (int cta = 0; cta < ctas; ++cta) {
    for (int n = 0; n < 4 * order.items + 4; ++n) {
      const TileOrder::Item it = order.item(n, cta, ctas);
      if (!it.more) break;
      if (!it.exists) continue;
      EXPECT_GE(it.x, 0);
      EXPECT_LT(it.x, order.m_blocks);
      EXPECT_GE(it.y, 0);
      EXPECT_LT(it.y, order.heads);
      const int index = (it.z * order.heads + it.y) * order.m_blocks + it.x;
      if (index < 0 || index >= order.items) {
        ADD_FAILURE() << "item out of range: " << index;
        continue;
      }
      ++seen[index];
      if (per_cta) (*per_cta)[cta].push_back(it.x);
    }
  }
  return seen;
}

class TileOrderWalk : public ::testing::TestWithParam<WalkShape> {};

TEST_P(TileOrderWalk, EveryItemOnce) {
  const WalkShape w = GetParam();
  const TileOrder order = TileOrder::make(w.m_blocks, w.heads, w.m_blocks * w.heads * w.z, w.paired, w.ctas);
  const std::vector<int> seen = visits(order, w.ctas);
  for (int i = 0; i < order.items; ++i) EXPECT_EQ(seen[i], 1) << "item " << i;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, TileOrderWalk,
    ::testing::Values(WalkShape{128, 16, 1, 132, true}, WalkShape{128, 16, 1, 132, false},
                      WalkShape{11, 32, 8, 132, true},  // odd blocks: a middle block alone
                      WalkShape{4, 16, 32, 132, true}, WalkShape{4, 16, 32, 132, false},
                      WalkShape{1, 3, 5, 7, true},    // one block per head: its pair is itself
                      WalkShape{9, 8, 3, 132, true},  // fewer units than CTAs
                      WalkShape{6, 4, 2, 6, true},    // CTA count a multiple of the pair count
                      WalkShape{16, 8, 8, 132, true}, WalkShape{3, 2, 1, 1, true}, WalkShape{3, 2, 1, 1, false}),
    [](const auto& info) {
      const WalkShape& w = info.param;
      return "m" + std::to_string(w.m_blocks) + "_h" + std::to_string(w.heads) + "_z" + std::to_string(w.z) +
             "_ctas" + std::to_string(w.ctas) + (w.paired ? "_paired" : "_stride");
    });

// Square causal mask: query block x (0 = heaviest) of m sees m - x key tiles
// (BM = BN). A paired walk gives each CTA whole pairs of m + 1 tiles, so
// CTAs' totals differ by at most one pair (and the odd middle block); the
// pair index rotating with the head spreads the half-cost middle blocks.
TEST(TileOrderCost, PairsBalanceCausalBlocks) {
  for (const int m : {4, 11, 16, 128}) {
    const int ctas = 132;
    const TileOrder order = TileOrder::make(m, 16, m * 16 * 4, true, ctas);
    std::vector<std::vector<int>> per_cta;
    const std::vector<int> seen = visits(order, ctas, &per_cta);
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
    long long lo = -1, hi = 0, total = 0;
    for (const auto& xs : per_cta) {
      long long tiles = 0;
      for (int x : xs) tiles += m - x;
      total += tiles;
      hi = std::max(hi, tiles);
      lo = lo < 0 ? tiles : std::min(lo, tiles);
    }
    EXPECT_EQ(total, static_cast<long long>(m) * (m + 1) / 2 * 16 * 4);
    EXPECT_LE(hi - lo, 2LL * (m + 1)) << "m = " << m;
  }
}

// Without a causal mask a head's last block is partial where BM does not
// divide the length (D = 64's 192-row blocks: 512 keys = 192 + 192 + 128).
// With a CTA count that is a multiple of the block count, a plain stride
// gave each CTA the same block in every round; rotated, every CTA takes the
// partial block about as often as any other (within two: its rounds differ
// by one, and its first block by the CTA).
TEST(TileOrderCost, RotationSpreadsPartialBlocks) {
  for (const int m : {3, 6, 11, 22, 4}) {
    const int ctas = 132, heads = 32, z = 32;
    const TileOrder order = TileOrder::make(m, heads, m * heads * z, false, ctas);
    std::vector<std::vector<int>> per_cta;
    const std::vector<int> seen = visits(order, ctas, &per_cta);
    ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](int v) { return v == 1; }));
    int lo = -1, hi = 0;
    for (const auto& xs : per_cta) {
      const int last = static_cast<int>(std::count(xs.begin(), xs.end(), m - 1));
      hi = std::max(hi, last);
      lo = lo < 0 ? last : std::min(lo, last);
    }
    EXPECT_GE(lo, 1) << "m = " << m << ": a CTA never takes the partial block";
    EXPECT_LE(hi - lo, 2) << "m = " << m;
  }
}

// The walk's coordinates through FastDivisor are the plain divisions' (the
// order the rules above were measured with).
TEST(TileOrderWalkDivisions, SameAsPlainDivision) {
  for (const bool paired : {false, true})
    for (const int m : {1, 2, 3, 7, 16, 33, 128, 255})
      for (const int heads : {1, 3, 16, 40})
        for (const int z : {1, 2, 5})
          for (const int ctas : {1, 7, 132}) {
            const TileOrder order = TileOrder::make(m, heads, m * heads * z, paired, ctas);
            for (int cta = 0; cta < ctas; ++cta)
              for (int n = 0; n < 2 * order.items / ctas + 4; ++n) {
                const TileOrder::Item it = order.item(n, cta, ctas);
                if (!paired) {
                  const int position = cta + n * ctas, head_start = position / m * m;
                  ASSERT_EQ(it.more, position < order.items);
                  ASSERT_EQ(it.x, (position % m + head_start / ctas) % m);
                  ASSERT_EQ(it.y, position / m % heads);
                  ASSERT_EQ(it.z, position / (m * heads));
                  continue;
                }
                const int pairs = (m + 1) / 2, unit = cta + (n >> 1) * ctas;
                const int k = (unit % pairs + unit / pairs) % pairs;
                const int x = n & 1 ? m - 1 - k : k;
                ASSERT_EQ(it.more, unit < pairs * (order.items / m));
                ASSERT_EQ(it.exists, !((n & 1) && x == k));
                ASSERT_EQ(it.x, x);
                ASSERT_EQ(it.y, unit / pairs % heads);
                ASSERT_EQ(it.z, unit / (pairs * heads));
              }
          }
}

}  // namespace
