// The shared-memory row layout of the decode kernel (common/swizzled_rows.hpp),
// pinned down without a GPU: every logical chunk has its own place inside its
// row, a quarter-warp's cp.async stores fill one aligned 128-byte line, and
// ldmatrix's eight rows at one logical chunk hit eight distinct 16-byte bank
// groups.
#include <gtest/gtest.h>

#include <set>
#include <utility>

#include "common/swizzled_rows.hpp"

namespace cuflash::detail {
namespace {

constexpr int kElementBytes = 2;
constexpr int kLineBytes = 128;

template <int D>
void check_layout() {
  using Rows = SwizzledRows<D>;
  SCOPED_TRACE("D = " + std::to_string(D));
  constexpr int kRows = 64;
  EXPECT_EQ(Rows::kPitch, swizzled_pitch(D));
  EXPECT_GE(Rows::kPitch, D);
  EXPECT_EQ(Rows::kPitch * kElementBytes % 64, 0);

  // A permutation of chunk slots inside each row.
  for (int r = 0; r < kRows; ++r) {
    std::set<int> seen;
    for (int c = 0; c < Rows::kChunks; ++c) {
      const int at = Rows::offset(r, c);
      EXPECT_GE(at, r * Rows::kPitch);
      EXPECT_LE(at + 8, (r + 1) * Rows::kPitch);
      EXPECT_EQ(at % 8, 0);
      EXPECT_TRUE(seen.insert(at).second) << "row " << r << " chunk " << c;
    }
  }

  // The loaders' thread order: chunk fastest, then row. Eight consecutive
  // threads (a quarter-warp of 16-byte stores) share one 128-byte line.
  for (int first = 0; first + 8 <= kRows * Rows::kChunks; first += 8) {
    std::set<int> lines;
    for (int t = first; t < first + 8; ++t)
      lines.insert(Rows::offset(t / Rows::kChunks, t % Rows::kChunks) * kElementBytes / kLineBytes);
    if (Rows::kChunks % 8 == 0 || Rows::kChunks < 8) EXPECT_EQ(lines.size(), 1u) << "threads " << first << "..";
  }

  // ldmatrix: rows r0..r0+7 at one logical chunk, distinct 16-byte slots of the 128-byte bank window.
  for (int r0 = 0; r0 < kRows; r0 += 8)
    for (int c = 0; c < Rows::kChunks; ++c) {
      std::set<int> slots;
      for (int r = r0; r < r0 + 8; ++r) slots.insert(Rows::offset(r, c) * kElementBytes % kLineBytes / 16);
      EXPECT_EQ(slots.size(), 8u) << "rows " << r0 << ".. chunk " << c;
    }
}

TEST(SwizzledRows, EveryHeadDim) {
  check_layout<32>();
  check_layout<64>();
  check_layout<96>();
  check_layout<128>();
  check_layout<192>();
  check_layout<256>();
}

}  // namespace
}  // namespace cuflash::detail
