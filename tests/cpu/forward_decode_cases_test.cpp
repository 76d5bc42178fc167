// The decode-shaped KV-cache cases (common/decode_cases.hpp) and the
// KV-cache checks the GPU suites share (common/kv_cache_checks.hpp), on the
// CPU backend: every case is a valid call that the reference matches the
// float64 oracle on, so a GPU failure on one points at the GPU; and the
// checks themselves hold where the answer is known (the reference writes
// only its append slots, and computes the same bits from a paged and a
// contiguous copy of one cache).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/attention_check.hpp"
#include "common/decode_cases.hpp"
#include "common/kv_cache_checks.hpp"

namespace cuflash::test {
namespace {

class CpuForwardDecodeCases : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardDecodeCases, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

INSTANTIATE_TEST_SUITE_P(Decode, CpuForwardDecodeCases,
                         ::testing::ValuesIn(for_dtypes(decode_cases(), {DType::f32, DType::bf16})), CaseSpecName());

TEST(CpuKvCacheChecks, PagedAndContiguousCopiesGiveTheSameBits) {
  CUFLASH_TEST_RNG(rng);
  for (int page : {1, 16, 64, 256}) {
    SCOPED_TRACE("page_size " + std::to_string(page));
    CaseSpec contiguous_spec = decode_case("contiguous", 0, 3, 2, {300, 0, 1000, 64}, 8, 2, 64);
    contiguous_spec.dtype = DType::bf16;
    contiguous_spec.alibi = AlibiKind::per_head;
    CaseSpec paged_spec = contiguous_spec;
    paged_spec.page_size = page;
    AttentionCase contiguous(contiguous_spec, rng.engine());
    AttentionCase paged(paged_spec, rng.engine());
    copy_logical_contents(contiguous, paged);
    HostApiRunner runner(Backend::cpu);
    check_forward(contiguous, runner);
    check_forward(paged, runner);
    EXPECT_EQ(count_output_differences(contiguous, paged), 0);
  }
}

TEST(CpuKvCacheChecks, DifferentContentsDiffer) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec spec = decode_case("paged16", 16, 1, 1, {40, 3}, 4, 2, 64);
  AttentionCase a(spec, rng.engine()), b(spec, rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(a, runner);
  check_forward(b, runner);
  EXPECT_GT(count_output_differences(a, b), 0) << "the comparison cannot see a difference";
}

TEST(CpuKvCacheChecks, SentinelRowsSurviveTheAppend) {
  CUFLASH_TEST_RNG(rng);
  for (int page : {0, 16}) {
    SCOPED_TRACE("page_size " + std::to_string(page));
    CaseSpec s = decode_case("sentinel", page, 5, 40, {10, 0, 33, 16}, 8, 2, 64);
    s.guard_pages = 5;
    s.capacity_slack = 9;
    s.poison_unused = false;
    s.dtype = DType::bf16;
    AttentionCase c(s, rng.engine());
    constexpr double kSentinel = -3.0;
    ASSERT_GT(fill_unowned_cache_rows(c, kSentinel), 0);
    EXPECT_EQ(count_unowned_cache_changes(c, kSentinel), 0);
    HostApiRunner runner(Backend::cpu);
    check_forward(c, runner);
    EXPECT_EQ(count_unowned_cache_changes(c, kSentinel), 0);
    // And the count sees a write: one element of a guard row changed by hand
    // (the first sentinel-valued element that is one: a random cached value
    // can equal the sentinel too).
    AttentionCase touched = c;
    bool seen = false;
    for (std::int64_t i = touched.k.numel() - 1; i >= 0 && !seen; --i) {
      if (touched.k.get(i) != kSentinel) continue;
      touched.k.set(i, 0.0);
      seen = count_unowned_cache_changes(touched, kSentinel) == 1;
      if (!seen) touched.k.set(i, kSentinel);
    }
    EXPECT_TRUE(seen) << "no change to a guard row was counted";
  }
}

}  // namespace
}  // namespace cuflash::test
