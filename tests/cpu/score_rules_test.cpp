// The rules the kernels and the CPU reference share, on the host: the score
// rules (src/core/score_rules.hpp) against a plain 64-bit statement of the
// mask from docs/semantics.md, and the softmax-state merge
// (src/core/softmax_merge.hpp) in float and double.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "score_rules.hpp"
#include "softmax_merge.hpp"

namespace cuflash::test {
namespace {

using detail::ScoreRules;

struct Sequence {
  int q_len, k_len, k_first, offset, window_left, window_right;
};

ScoreRules rules_of(const Sequence& s, float scale = 0.125f, float softcap = 0.0f, bool alibi = false) {
  ScoreRules r;
  r.set_sequence(s.q_len, s.k_len, s.k_first, s.offset, s.window_left, s.window_right);
  r.set_scales(scale, scale * detail::kLog2e, softcap);
  if (alibi) r.alibi_log2 = 0.25f * detail::kLog2e;
  r.set_transformed(alibi);
  return r;
}

// docs/semantics.md's mask, in 64 bits with the caller's windows unclamped.
bool sees(const Sequence& s, std::int64_t i, std::int64_t j) {
  const std::int64_t position = i + s.offset;
  return j >= s.k_first && j < s.k_len && (s.window_left < 0 || j >= position - s.window_left) &&
         (s.window_right < 0 || j <= position + s.window_right);
}

// Sequences with every kind of mask: none, causal (bottom-right, queries
// fewer and more than keys), sliding windows, windows wider than the
// sequence (INT_MAX: clamped to unbounded), a leftpad's first key, and an
// explicit diagonal offset of either sign.
std::vector<Sequence> sequences() {
  const std::pair<int, int> lengths[] = {{7, 7}, {5, 11}, {11, 5}, {1, 9}, {9, 1}};
  const std::pair<int, int> windows[] = {{-1, -1}, {-1, 0},      {2, 0},           {0, 3},
                                         {3, 1},   {INT_MAX, 0}, {INT_MAX, INT_MAX}, {-1, INT_MAX}};
  std::vector<Sequence> all;
  for (const auto& [q_len, k_len] : lengths) {
    const int bottom_right = k_len - q_len;
    for (const auto& [left, right] : windows) {
      all.push_back({q_len, k_len, 0, bottom_right, left, right});
      all.push_back({q_len, k_len, k_len / 3, bottom_right, left, right});
      all.push_back({q_len, k_len, 0, 4, left, right});
      all.push_back({q_len, k_len, 0, -6, left, right});
    }
  }
  return all;
}

TEST(ScoreRules, RowKeysAreTheVisibleKeys) {
  for (const Sequence& s : sequences()) {
    const ScoreRules r = rules_of(s);
    for (int i = 0; i < s.q_len; ++i) {
      int lo = 0, hi = 0;
      r.row_keys(i, &lo, &hi);
      for (int j = 0; j < s.k_len + 2; ++j) {
        const bool expected = sees(s, i, j);
        EXPECT_EQ(r.visible(i, j), expected) << "row " << i << " key " << j << " window " << s.window_left << ","
                                             << s.window_right << " offset " << s.offset << " k_first " << s.k_first;
        EXPECT_EQ(j >= lo && j < hi, expected) << "row " << i << " key " << j << " [" << lo << ", " << hi << ")";
      }
    }
  }
}

// The rows that see a key (the backward's per-key form of the mask) are
// the rows whose visible keys hold it, for keys past the sequence too (a
// tile's last rows).
TEST(ScoreRules, KeyRowsAreTheRowsThatSeeTheKey) {
  for (const Sequence& s : sequences()) {
    const ScoreRules r = rules_of(s);
    for (int j = 0; j < s.k_len + 3; ++j) {  // (keys are never negative, as for visible())
      int lo = -7, hi = -7;
      r.key_rows(j, s.q_len, &lo, &hi);
      EXPECT_GE(lo, 0);
      EXPECT_LE(lo, s.q_len);
      EXPECT_GE(hi, 0);
      EXPECT_LE(hi, s.q_len);
      for (int i = -2; i < s.q_len + 3; ++i) {
        const bool expected = i >= 0 && i < s.q_len && sees(s, i, j);
        EXPECT_EQ(i >= lo && i < hi, expected) << "row " << i << " key " << j << " [" << lo << ", " << hi
                                               << ") window " << s.window_left << "," << s.window_right
                                               << " offset " << s.offset << " k_first " << s.k_first;
      }
    }
  }
}

// Key rows at the extremes validate() allows (lengths and |offset| up to
// 2^30): no overflow of j - offset - window.
TEST(ScoreRules, KeyRowsAtTheLimits) {
  const int big = 1 << 30;
  const Sequence far_offset{big, big, 0, -big, -1, 0};  // causal, keys aligned far below the rows
  const ScoreRules r = rules_of(far_offset);
  int lo = 0, hi = 0;
  r.key_rows(big - 1, big, &lo, &hi);
  EXPECT_EQ(lo, big);  // row big - 1 + big would see it: past the rows
  EXPECT_EQ(hi, big);
  r.key_rows(0, big, &lo, &hi);
  EXPECT_EQ(lo, big);
  const Sequence near_offset{big, big, 0, big - 1, 0, -1};  // window_left 0: key j seen by row j - offset only
  const ScoreRules n = rules_of(near_offset);
  n.key_rows(0, big, &lo, &hi);
  EXPECT_GE(lo, hi);  // row -(big - 1): none
  n.key_rows(big - 1, big, &lo, &hi);
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, 1);
}

// A tile the rules call unmasked is seen whole by every row; the key range
// of a block of rows holds every key one of them sees.
TEST(ScoreRules, TilesAndKeyRangesHoldTheRowsKeys) {
  int unmasked_tiles = 0;
  for (const Sequence& s : sequences()) {
    const ScoreRules r = rules_of(s);
    for (int row0 = 0; row0 < s.q_len; ++row0)
      for (int rows = 1; row0 + rows <= s.q_len; ++rows) {
        int lo = 0, hi = 0;
        r.key_range(row0, rows, &lo, &hi);
        for (int i = row0; i < row0 + rows; ++i)
          for (int j = 0; j < s.k_len; ++j)
            if (sees(s, i, j)) EXPECT_TRUE(j >= lo && j < hi) << "row " << i << " key " << j;
        for (int key0 = 0; key0 < s.k_len; ++key0)
          for (int keys = 1; key0 + keys <= s.k_len + 1; ++keys) {
            if (!r.tile_unmasked(row0, rows, key0, keys)) continue;
            ++unmasked_tiles;
            for (int i = row0; i < row0 + rows; ++i)
              for (int j = key0; j < key0 + keys; ++j) EXPECT_TRUE(sees(s, i, j)) << "row " << i << " key " << j;
          }
      }
  }
  EXPECT_GT(unmasked_tiles, 0);  // the check above is not vacuous
}

// A tile is called unmasked exactly when every row of the block sees every
// key of it (docs/semantics.md's mask), and unmasked_keys is that rule as a
// range; unmasked_steps_down picks exactly the unmasked tiles of a walk
// down from tile t_hi - 1, for every tile size, block of rows and end tile
// (the TMA forward skips the mask test on those steps).
TEST(ScoreRules, UnmaskedRangesAreTheUnmaskedTiles) {
  int unmasked_steps = 0, masked_steps = 0;
  for (const Sequence& s : sequences()) {
    const ScoreRules r = rules_of(s);
    for (int row0 = 0; row0 < s.q_len; ++row0)
      for (int rows = 1; row0 + rows <= s.q_len; ++rows) {
        int lo = 0, hi = 0;
        r.unmasked_keys(row0, rows, &lo, &hi);
        for (int key0 = 0; key0 < s.k_len + 3; ++key0)
          for (int keys = 1; keys <= s.k_len + 3; ++keys) {
            bool all_seen = true;
            for (int i = row0; i < row0 + rows; ++i)
              for (int j = key0; j < key0 + keys; ++j) all_seen &= sees(s, i, j);
            EXPECT_EQ(r.tile_unmasked(row0, rows, key0, keys), all_seen)
                << "rows " << row0 << "+" << rows << " keys " << key0 << "+" << keys;
            EXPECT_EQ(lo <= key0 && key0 + keys <= hi, all_seen)
                << "rows " << row0 << "+" << rows << " keys " << key0 << "+" << keys;
          }
        for (int tile_keys = 1; tile_keys <= 4; ++tile_keys)
          for (int t_hi = 0; t_hi * tile_keys <= s.k_len + 2 * tile_keys; ++t_hi) {
            int j_lo = 0, j_hi = 0;
            r.unmasked_steps_down(row0, rows, t_hi, tile_keys, &j_lo, &j_hi);
            for (int j = 0; j < t_hi; ++j) {
              const bool unmasked = r.tile_unmasked(row0, rows, (t_hi - 1 - j) * tile_keys, tile_keys);
              (unmasked ? unmasked_steps : masked_steps) += 1;
              EXPECT_EQ(j >= j_lo && j < j_hi, unmasked) << "rows " << row0 << "+" << rows << " tile_keys "
                                                         << tile_keys << " t_hi " << t_hi << " step " << j;
            }
          }
      }
  }
  EXPECT_GT(unmasked_steps, 0);  // both kinds of step occur
  EXPECT_GT(masked_steps, 0);
}

// A tile the rules call hidden is seen by no row (the kernels skip its
// GEMMs); and a tile no row sees that lies wholly on one side of the
// visible band is called hidden (the rule is not so loose that it never fires).
TEST(ScoreRules, HiddenTilesAreSeenByNoRow) {
  int hidden_tiles = 0;
  for (const Sequence& s : sequences()) {
    const ScoreRules r = rules_of(s);
    for (int row0 = 0; row0 < s.q_len; ++row0)
      for (int rows = 1; row0 + rows <= s.q_len; ++rows)
        for (int key0 = 0; key0 < s.k_len; ++key0)
          for (int keys = 1; key0 + keys <= s.k_len + 1; ++keys) {
            bool seen = false, below = true, above = true;
            for (int i = row0; i < row0 + rows; ++i) {
              int lo = 0, hi = 0;
              r.row_keys(i, &lo, &hi);
              for (int j = key0; j < key0 + keys; ++j) seen |= sees(s, i, j);
              below &= key0 + keys <= lo;
              above &= key0 >= hi;
            }
            const bool hidden = r.tile_hidden(row0, rows, key0, keys);
            if (hidden) {
              ++hidden_tiles;
              EXPECT_FALSE(seen) << "rows " << row0 << "+" << rows << " keys " << key0 << "+" << keys;
            }
            if (below || above) EXPECT_TRUE(hidden) << "rows " << row0 << "+" << rows << " keys " << key0 << "+" << keys;
          }
  }
  EXPECT_GT(hidden_tiles, 0);
}

TEST(ScoreRules, Logits) {
  const Sequence s{6, 9, 0, 3, -1, -1};
  const float scale = 0.125f, softcap = 20.0f, slope = 0.25f;
  const double log2e = 1.4426950408889634;
  // Plain: scale * dot in base 2; untransformed.
  const ScoreRules plain = rules_of(s, scale);
  EXPECT_FALSE(plain.transformed);
  EXPECT_FLOAT_EQ(plain.logit2(3.0f, 1, 2), static_cast<float>(3.0 * scale * log2e));
  // Softcap: cap * tanh(scale * dot / cap), and its factor on dS.
  const ScoreRules capped = rules_of(s, scale, softcap);
  EXPECT_TRUE(capped.transformed);
  float squashed = -1.0f;
  const float dot = 90.0f;
  const double t = std::tanh(scale * dot / softcap);
  EXPECT_NEAR(capped.logit2(dot, 1, 2, 0.0f, &squashed), softcap * t * log2e, 1e-4);
  EXPECT_NEAR(squashed, t, 1e-6);
  EXPECT_NEAR(ScoreRules::softcap_grad(squashed), 1.0 - t * t, 1e-6);
  // ALiBi: - slope * |i + offset - j|, on either side of the diagonal; a
  // call with ALiBi is transformed even where a head's slope is 0.
  const ScoreRules alibi = rules_of(s, scale, 0.0f, true);
  EXPECT_TRUE(alibi.transformed);
  for (const int j : {0, 4, 8})
    EXPECT_NEAR(alibi.logit2(3.0f, 1, j), (3.0 * scale - slope * std::abs(1 + 3 - j)) * log2e, 1e-5) << "key " << j;
  EXPECT_FLOAT_EQ(alibi.logit2(3.0f, 1, 0, 0.0f), plain.logit2(3.0f, 1, 0));
  float no_cap = -1.0f;
  alibi.logit2(3.0f, 1, 0, 0.0f, &no_cap);
  EXPECT_EQ(no_cap, 0.0f);
}

template <class Real>
void check_merge() {
  using detail::merge_lse;
  const Real inf = std::numeric_limits<Real>::infinity();
  // Both empty: lse -inf, no weight.
  auto m = merge_lse<Real>(-inf, -inf);
  EXPECT_EQ(m.lse, -inf);
  EXPECT_EQ(m.weight_a, Real(0));
  EXPECT_EQ(m.weight_b, Real(0));
  // One empty: the other side whole.
  m = merge_lse<Real>(Real(2.5), -inf);
  EXPECT_EQ(m.lse, Real(2.5));
  EXPECT_EQ(m.weight_a, Real(1));
  EXPECT_EQ(m.weight_b, Real(0));
  // Far apart (exp of either alone would overflow float): no overflow.
  m = merge_lse<Real>(Real(1000), Real(990));
  EXPECT_NEAR(static_cast<double>(m.lse), 1000.0 + std::log1p(std::exp(-10.0)), 1e-3);
  EXPECT_NEAR(static_cast<double>(m.weight_a + m.weight_b), 1.0, 1e-6);
  // Three states by the n-state rule equal two pairwise merges.
  const Real lse[3] = {Real(0.5), Real(-1.25), Real(2.0)};
  Real top = -inf;
  for (const Real x : lse) top = detail::merge_max(top, x);
  Real total = 0;
  for (const Real x : lse) total += detail::lse_weight(x, top);
  const auto first = merge_lse<Real>(lse[0], lse[1]);
  const auto both = merge_lse<Real>(first.lse, lse[2]);
  EXPECT_NEAR(static_cast<double>(detail::merged_lse(top, total)), static_cast<double>(both.lse), 1e-5);
  EXPECT_NEAR(static_cast<double>(both.lse), std::log(std::exp(0.5) + std::exp(-1.25) + std::exp(2.0)), 1e-5);
}

TEST(SoftmaxMerge, FloatAndDouble) {
  check_merge<float>();
  check_merge<double>();
}

}  // namespace
}  // namespace cuflash::test
