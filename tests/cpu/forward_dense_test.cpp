// CPU forward on dense batches against the float64 oracle: shapes (lengths,
// head dims, GQA ratios) and every option alone and combined.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/attention_check.hpp"
#include "common/option_cases.hpp"

namespace cuflash::test {
namespace {

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

class CpuForwardDense : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardDense, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

std::vector<CaseSpec> head_dim_cases() {
  std::vector<CaseSpec> cases;
  for (int d : {32, 40, 64, 96, 128, 160, 192, 256})
    cases.push_back(dense_case("d" + std::to_string(d), 17, 40, 2, 1, d));
  return for_dtypes(cases, kAllDtypes);
}

std::vector<CaseSpec> length_cases() {
  std::vector<CaseSpec> cases = for_dtypes(
      {
          dense_case("q1_k1", 1, 1, 2, 1, 64),
          dense_case("q1_k255", 1, 255, 2, 1, 64),
          dense_case("q17_k17", 17, 17, 2, 1, 64),
          dense_case("q17_k255", 17, 255, 2, 1, 64),
          dense_case("q255_k17", 255, 17, 2, 1, 64),
          dense_case("q255_k255", 255, 255, 2, 1, 64, 1),
      },
      kAllDtypes);
  for (const CaseSpec& s : for_dtypes({dense_case("q1024_k1024", 1024, 1024, 1, 1, 64, 1)}, {DType::f32, DType::bf16}))
    cases.push_back(s);
  return cases;
}

std::vector<CaseSpec> gqa_cases() {
  return for_dtypes({dense_case("gqa1_h2", 33, 47, 2, 2, 64), dense_case("gqa2_h4", 33, 47, 4, 2, 64),
                     dense_case("gqa8_h8", 33, 47, 8, 1, 64)},
                    kAllDtypes);
}

std::vector<CaseSpec> option_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  for (CaseSpec causal : {
           dense_case("causal_square", 45, 45, 4, 2, 64),
           dense_case("causal_q_shorter", 17, 255, 2, 1, 64),
           // Bottom-right alignment with more queries than keys: the first rows see nothing.
           dense_case("causal_q_longer", 255, 17, 2, 1, 64),
           dense_case("decode_causal", 1, 255, 4, 1, 64),
       }) {
    causal.options.causal = true;
    add(causal);
  }

  for (CaseSpec& variant_case : option_variant_cases()) add(std::move(variant_case));
  // A softmax_scale that is not positive: uniform weights at 0, the smallest
  // scores weighing most when negative.
  CaseSpec scaled = dense_case("scale_zero", 37, 53, 4, 2, 64);
  scaled.options.softmax_scale = 0.0f;
  add(scaled);
  scaled = dense_case("scale_negative_causal", 37, 53, 4, 2, 64);
  scaled.options.softmax_scale = -0.3f;
  scaled.options.causal = true;
  add(scaled);
  return for_dtypes(cases, kAllDtypes);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CpuForwardDense, ::testing::ValuesIn(head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Lengths, CpuForwardDense, ::testing::ValuesIn(length_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Gqa, CpuForwardDense, ::testing::ValuesIn(gqa_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Options, CpuForwardDense, ::testing::ValuesIn(option_cases()), CaseSpecName());

// Rows that see no key: out exactly 0, lse exactly -inf, spelled out rather
// than left to the generic comparison.
TEST(CpuForwardMaskedRows, ZeroOutputAndNegativeInfinityLse) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = dense_case("masked", 9, 4, 2, 1, 32, 1);
  s.options.causal = true;  // offset -5: queries 0..4 see nothing
  AttentionCase c(s, rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
  const std::int64_t row = 2 * 32;
  for (int i = 0; i < 9; ++i) {
    const bool masked = i < 5;
    for (int h = 0; h < 2; ++h) {
      const double lse = c.lse.get(h * 9 + i);
      if (masked) {
        EXPECT_EQ(lse, -std::numeric_limits<double>::infinity()) << "query " << i << " head " << h;
      } else {
        EXPECT_TRUE(std::isfinite(lse)) << "query " << i << " head " << h;
      }
      if (!masked) continue;
      for (int d = 0; d < 32; ++d)
        EXPECT_EQ(c.out.get(i * row + h * 32 + d), 0.0) << "query " << i << " head " << h << " dim " << d;
    }
  }
}

}  // namespace
}  // namespace cuflash::test
