// The Hopper backward's interleaved launch order of key blocks
// (src/cuda/sm90/bwd_chain_order.hpp) on the host: every (chain, key block)
// is owned by exactly one place of the order, a block's predecessor in its
// chain (the one whose turn comes before its own, ascending) is launched
// before it, and consecutive blocks of a chain are `interleave` places apart
// inside a whole group; and the group size the plan asks for.
#include "sm90/bwd_chain_order.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace {

using cuflash::detail::sm90::bwd_chain_interleave;
using cuflash::detail::sm90::BwdChainOrder;

TEST(BwdChainOrder, EachBlockOnceAndAfterItsPredecessor) {
  for (int key_blocks : {1, 2, 3, 8, 17, 64}) {
    for (int chains : {1, 2, 5, 12, 31}) {
      for (int interleave = 1; interleave <= chains + 1; ++interleave) {
        const BwdChainOrder order{key_blocks, chains, interleave < chains ? interleave : chains};
        // place[chain][block]: where the order launches it.
        std::vector<std::vector<std::int64_t>> place(chains, std::vector<std::int64_t>(key_blocks, -1));
        const std::int64_t total = std::int64_t{key_blocks} * chains;
        for (std::int64_t linear = 0; linear < total; ++linear) {
          int chain = -1, block = -1;
          order.at(linear, &chain, &block);
          ASSERT_GE(chain, 0);
          ASSERT_LT(chain, chains);
          ASSERT_GE(block, 0);
          ASSERT_LT(block, key_blocks);
          ASSERT_EQ(place[chain][block], -1) << "chain " << chain << " block " << block << " owned twice";
          place[chain][block] = linear;
        }
        const int width = order.interleave;
        for (int c = 0; c < chains; ++c) {
          // A chain in a whole group: its blocks `interleave` places apart.
          const bool whole_group = (c / width + 1) * width <= chains;
          for (int j = 1; j < key_blocks; ++j) {
            EXPECT_LT(place[c][j - 1], place[c][j]) << "chain " << c << " block " << j;
            if (whole_group) EXPECT_EQ(place[c][j] - place[c][j - 1], width);
          }
        }
      }
    }
  }
}

TEST(BwdChainOrder, InterleaveOfOneIsTheGridsOrder) {
  const BwdChainOrder order{7, 5, 1};
  for (std::int64_t linear = 0; linear < 35; ++linear) {
    int chain = -1, block = -1;
    order.at(linear, &chain, &block);
    EXPECT_EQ(block, linear % 7);
    EXPECT_EQ(chain, linear / 7);
  }
}

TEST(BwdChainOrder, GroupsFillHalfOfL2) {
  // Bytes per chain at D = 256: (256 x 8 + 8) per row; the sweep's 16k tokens, 8 heads.
  const std::int64_t row = 256 * 8 + 8;
  EXPECT_EQ(bwd_chain_interleave(row * 512, 256), 23);
  EXPECT_EQ(bwd_chain_interleave(row * 1024, 128), 11);
  EXPECT_EQ(bwd_chain_interleave(row * 4096, 32), 2);
  EXPECT_EQ(bwd_chain_interleave(row * 16384, 8), 1);  // 32 MiB: over the budget, one chain
  EXPECT_EQ(bwd_chain_interleave(1000, 6), 6);          // never more than the chains
  EXPECT_EQ(bwd_chain_interleave(1000, 1), 1);
  EXPECT_EQ(bwd_chain_interleave(0, 4), 1);
}

}  // namespace
