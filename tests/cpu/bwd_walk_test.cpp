// The Hopper backward's walks and deterministic turns
// (src/cuda/sm90/bwd_walk.hpp) on the host, over random sequences, windows
// and diagonal offsets: a key block's walk visits exactly the query tiles
// that see one of its keys, and in deterministic calls the blocks that add
// into a tile are numbered 0, 1, ... in block order (descending under a right
// bound, as the kernel chooses), so that each waits only on a CTA launched
// before it (the kernel walks the grid in reverse when descending) that
// reaches the tile no later in its own walk. The GPU tests run a few shapes;
// these run thousands.
#include "sm90/bwd_walk.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "score_rules.hpp"

namespace {

using cuflash::detail::KeyVisibility;
using cuflash::detail::ScoreRules;
using cuflash::detail::sm90::bwd_blocks_before;
using cuflash::detail::sm90::bwd_walk;
using cuflash::detail::sm90::BwdWalk;
using cuflash::detail::sm90::BwdWalkCursor;
using cuflash::detail::sm90::kBwdTileRows;

constexpr int kBlockKeys = 128;  // the kernel's BN

struct Shape {
  KeyVisibility v;
  int k_len = 0;
};

Shape random_shape(std::mt19937& rng) {
  auto pick = [&](int lo, int hi) { return lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1)); };
  Shape s;
  s.v.q_len = pick(1, 700);
  s.k_len = pick(1, 900);
  // Bottom-right aligned (no diagonal_offset) or an explicit offset.
  s.v.offset = pick(0, 2) == 0 ? pick(-500, 500) : s.k_len - s.v.q_len;
  const int mode = pick(0, 4);  // none, causal, causal + left, both sides, left only
  s.v.window_right = mode == 0 || mode == 4 ? -1 : mode == 3 ? pick(0, 300) : 0;
  s.v.window_left = mode == 2 || mode == 3 || mode == 4 ? pick(0, 400) : -1;
  return s;
}

// Whether `row` sees `key`: the kernels' and the CPU reference's own rule
// (score_rules.hpp), which the walks must agree with.
bool visible(const Shape& s, int row, int key) {
  ScoreRules rules;
  rules.set_sequence(s.v.q_len, s.k_len, 0, static_cast<int>(s.v.offset), s.v.window_left, s.v.window_right);
  return rules.visible(row, key);
}

int blocks_of(const Shape& s) { return (s.k_len + kBlockKeys - 1) / kBlockKeys; }
// The query tile heights the kernel instantiates (64; 128 at D = 64).
constexpr int kTileRows[] = {kBwdTileRows, 2 * kBwdTileRows};

int tiles_of(const Shape& s, int rows) { return (s.v.q_len + rows - 1) / rows; }

BwdWalk walk_of(const Shape& s, int block, int rows) {
  const int n0 = block * kBlockKeys;
  return bwd_walk(s.v, n0, std::min(n0 + kBlockKeys, s.k_len), 0, 1, rows);
}

bool reaches(const BwdWalk& w, int tile) { return w.m_lo <= tile && tile < w.m_end; }

TEST(BwdWalk, WalksVisitExactlyTheTilesThatSeeTheirKeys) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 400; ++trial) {
    const Shape s = random_shape(rng);
    for (const int rows : kTileRows)
      for (int block = 0; block < blocks_of(s); ++block) {
        const BwdWalk w = walk_of(s, block, rows);
        const int n0 = block * kBlockKeys, n1 = std::min(n0 + kBlockKeys, s.k_len);
        for (int tile = 0; tile < tiles_of(s, rows); ++tile) {
          bool sees = false;
          for (int row = tile * rows; row < std::min((tile + 1) * rows, s.v.q_len) && !sees; ++row)
            for (int key = n0; key < n1 && !sees; ++key) sees = visible(s, row, key);
          ASSERT_EQ(reaches(w, tile), sees) << "trial " << trial << " rows " << rows << " block " << block;
        }
      }
  }
}

TEST(BwdWalk, TheCursorVisitsTheTilesOfHeadAndM0InOrder) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 200; ++trial) {
    const Shape s = random_shape(rng);
    const int group = 1 + static_cast<int>(rng() % 4), hk = static_cast<int>(rng() % 3);
    for (const int rows : kTileRows)
      for (int block = 0; block < blocks_of(s); ++block) {
        const int n0 = block * kBlockKeys;
        const BwdWalk w = bwd_walk(s.v, n0, std::min(n0 + kBlockKeys, s.k_len), hk, group, rows);
        BwdWalkCursor tile(w);
        for (int n = 0; n < w.tiles(); ++n, tile.next()) {
          ASSERT_EQ(tile.head(), w.head(n)) << "trial " << trial << " block " << block << " tile " << n;
          ASSERT_EQ(tile.m0(), w.m0(n)) << "trial " << trial << " block " << block << " tile " << n;
        }
      }
  }
}

TEST(BwdWalk, DeterministicTurnsNumberATilesBlocksInOrder) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 600; ++trial) {
    const Shape s = random_shape(rng);
    const int blocks = blocks_of(s);
    for (const int rows : kTileRows) {
      std::vector<BwdWalk> walks;
      for (int block = 0; block < blocks; ++block) walks.push_back(walk_of(s, block, rows));
      for (const bool descending : {false, true})
        for (int tile = 0; tile < tiles_of(s, rows); ++tile) {
        std::vector<int> adders;
        for (int block = 0; block < blocks; ++block)
          if (reaches(walks[block], tile)) adders.push_back(block);
        if (adders.empty()) continue;
        ASSERT_EQ(adders.back() - adders.front() + 1, static_cast<int>(adders.size()))
            << "trial " << trial << " tile " << tile << ": the blocks reaching it are not consecutive";
        for (std::size_t i = 0; i < adders.size(); ++i) {
          const int expected = descending ? static_cast<int>(adders.size() - 1 - i) : static_cast<int>(i);
          ASSERT_EQ(bwd_blocks_before(s.v, s.k_len, kBlockKeys, tile, adders[i], descending, rows), expected)
              << "trial " << trial << " tile " << tile << " block " << adders[i] << (descending ? " descending" : "");
        }
        }
    }
  }
}

// As the kernel runs them: descending exactly under a right bound, the grid
// then walked in reverse. The block before each one in a tile's order was
// launched earlier (so a CTA never waits on one that cannot start) and
// reaches the tile at the same step of its walk or earlier (so blocks that
// start together do not wait on each other).
TEST(BwdWalk, EachBlockWaitsOnAnEarlierLaunchedOneThatIsNoFurtherBehind) {
  std::mt19937 rng(13);
  for (int trial = 0; trial < 600; ++trial) {
    const Shape s = random_shape(rng);
    const bool descending = s.v.window_right >= 0;
    const int blocks = blocks_of(s);
    auto launch_index = [&](int block) { return descending ? blocks - 1 - block : block; };
    for (const int rows : kTileRows)
    for (int block = 0; block < blocks; ++block) {
      const BwdWalk w = walk_of(s, block, rows);
      for (int tile = w.m_lo; tile < w.m_end; ++tile) {
        if (bwd_blocks_before(s.v, s.k_len, kBlockKeys, tile, block, descending, rows) == 0) continue;
        const int before = descending ? block + 1 : block - 1;
        const BwdWalk wb = walk_of(s, before, rows);
        ASSERT_TRUE(reaches(wb, tile)) << "trial " << trial;
        EXPECT_LT(launch_index(before), launch_index(block)) << "trial " << trial << " block " << block;
        if (descending || s.v.window_right < 0)
          EXPECT_LE(tile - wb.m_lo, tile - w.m_lo) << "trial " << trial << " block " << block << " tile " << tile;
      }
    }
  }
}

}  // namespace
