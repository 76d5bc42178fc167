// The Hopper backward's padded row tiles and dQ tile order
// (src/cuda/sm90/bwd_row_tiles.hpp), on the host: sequences' padded rows
// start on tiles and never overlap, and the tile order is a permutation of
// the 64 x D tile whose blocks are the warps' contiguous 512-byte lines.
#include "sm90/bwd_row_tiles.hpp"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace {

using cuflash::detail::sm90::bwd_padded_rows;
using cuflash::detail::sm90::bwd_padded_start;
using cuflash::detail::sm90::DqTileOrder;
using cuflash::detail::sm90::kBwdTileRows;

TEST(BwdRowTiles, PaddedSequencesStartOnTilesAndDoNotOverlap) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 9);
    std::vector<long long> lens(batch);
    long long total = 0;
    for (long long& l : lens) total += l = static_cast<long long>(rng() % (trial % 2 ? 300 : 3));
    long long q_start = 0, used_end = 0;
    for (int b = 0; b < batch; ++b) {
      const long long start = bwd_padded_start(q_start, b);
      EXPECT_EQ(start % kBwdTileRows, 0);
      EXPECT_GE(start, used_end) << "sequence " << b << " overlaps the one before";
      // Its tiles: whole 64-row tiles from its start.
      used_end = start + (lens[b] + kBwdTileRows - 1) / kBwdTileRows * kBwdTileRows;
      q_start += lens[b];
    }
    EXPECT_LE(used_end, bwd_padded_rows(total, batch));
    EXPECT_EQ(bwd_padded_rows(total, batch) % kBwdTileRows, 0);
  }
}

template <int D, int ColumnBlocks = 2>
void check_tile_order() {
  using Order = DqTileOrder<D, ColumnBlocks>;
  std::vector<int> seen(Order::kFloats, 0);
  for (int r = 0; r < kBwdTileRows; ++r)
    for (int c = 0; c < D; ++c) {
      const int i = Order::index(r, c);
      ASSERT_GE(i, 0);
      ASSERT_LT(i, Order::kFloats);
      ++seen[i];
    }
  for (int n : seen) ASSERT_EQ(n, 1);
  // The accumulator fragment of warp w, lane 4 g + t, n8 block i of column
  // block c: four consecutive floats at block(c, w, i) + 4 lane.
  for (int c = 0; c < ColumnBlocks; ++c)
    for (int w = 0; w < 4; ++w)
      for (int i = 0; i < Order::kBlocks; ++i)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, t = lane % 4, col = c * Order::kColsPerConsumer + 8 * i + 2 * t;
          const int at = Order::block(c, w, i) + 4 * lane;
          EXPECT_EQ(Order::index(16 * w + g, col), at);
          EXPECT_EQ(Order::index(16 * w + g, col + 1), at + 1);
          EXPECT_EQ(Order::index(16 * w + g + 8, col), at + 2);
          EXPECT_EQ(Order::index(16 * w + g + 8, col + 1), at + 3);
        }
  // quad() inverts index() four floats at a time.
  for (int q = 0; q < Order::kFloats / 4; ++q) {
    const auto at = Order::quad(q);
    ASSERT_EQ(Order::index(at.row, at.col), 4 * q) << "quad " << q;
    ASSERT_EQ(Order::index(at.row, at.col + 1), 4 * q + 1) << "quad " << q;
    ASSERT_EQ(Order::index(at.row + 8, at.col), 4 * q + 2) << "quad " << q;
    ASSERT_EQ(Order::index(at.row + 8, at.col + 1), 4 * q + 3) << "quad " << q;
  }
}

TEST(BwdRowTiles, DqTileOrderIsAPermutationOfWarpLines) {
  check_tile_order<64>();  // two consumers, D / 2 columns each
  check_tile_order<128>();
  check_tile_order<256>();
  check_tile_order<64, 1>();  // a consumer's own rows, all columns (128-row query tiles)
}

}  // namespace
