// CPU forward on packed variable-length batches against the float64 oracle.
// Every case includes an empty sequence and packed rows after cu_seqlens[B]:
// those rows hold NaN as input and must still hold the NaN poison after the
// call (the oracle marks them NaN, which the comparison requires to match).
#include <gtest/gtest.h>

#include <cmath>

#include "common/attention_check.hpp"

namespace cuflash::test {
namespace {

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

// cu_seqlens_q = {0, 5, 5, 40, 41}: lengths 5, 0, 35, 1.
CaseSpec varlen(const char* label, std::vector<int> q_lens, std::vector<int> kv_lens, int heads_q = 4,
                int heads_kv = 2, int head_dim = 64) {
  CaseSpec s;
  s.label = label;
  s.layout = CaseLayout::varlen;
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.extra_rows = 3;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  return s;
}

const std::vector<int> kSelfLens = {5, 0, 35, 1};
// Keys differ per sequence; sequence 3 has a query but no key (a row that sees nothing).
const std::vector<int> kCrossQ = {5, 0, 35, 7};
const std::vector<int> kCrossK = {12, 3, 20, 0};

class CpuForwardVarlen : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardVarlen, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
  // Rows after cu_seqlens_q[B] belong to no sequence: out and lse there keep the poison.
  const std::vector<bool> owned = c.q_rows_owned();
  std::int64_t untouched = 0, unowned = 0;
  for (std::int64_t i = 0; i < c.out.numel(); ++i)
    if (!owned[i]) {
      ++unowned;
      untouched += std::isnan(c.out.get(i)) ? 1 : 0;
    }
  EXPECT_EQ(untouched, unowned) << "out rows after cu_seqlens_q[B] were written";
}

std::vector<CaseSpec> varlen_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(varlen("self", kSelfLens, kSelfLens));
  s = varlen("self_causal", kSelfLens, kSelfLens);
  s.options.causal = true;
  add(s);
  add(varlen("cross", kCrossQ, kCrossK));
  s = varlen("cross_causal", kCrossQ, kCrossK);  // bottom-right per sequence
  s.options.causal = true;
  add(s);
  s = varlen("cross_window_3_2", kCrossQ, kCrossK);
  s.options.window_left = 3;
  s.options.window_right = 2;
  add(s);
  s = varlen("self_softcap_alibi_per_batch", kSelfLens, kSelfLens);
  s.options.softcap = 2.0f;
  s.alibi = AlibiKind::per_batch;
  add(s);
  s = varlen("self_alibi_per_head_causal", kSelfLens, kSelfLens);
  s.alibi = AlibiKind::per_head;
  s.options.causal = true;
  add(s);
  s = varlen("cross_gqa8_bhsd", kCrossQ, kCrossK, 8, 1);
  s.bhsd = true;
  add(s);
  s = varlen("self_padded_scale", kSelfLens, kSelfLens, 2, 2, 40);
  s.row_padding = 7;
  s.options.softmax_scale = 0.4f;
  add(s);
  s = varlen("self_d256_no_lse", kSelfLens, kSelfLens, 2, 1, 256);
  s.with_lse = false;
  add(s);
  s = varlen("long_mixed_causal", {1, 130, 0, 255}, {200, 130, 17, 255}, 2, 1, 128);
  s.options.causal = true;
  s.extra_rows = 0;
  add(s);
  return for_dtypes(cases, kAllDtypes);
}

INSTANTIATE_TEST_SUITE_P(Varlen, CpuForwardVarlen, ::testing::ValuesIn(varlen_cases()), CaseSpecName());

}  // namespace
}  // namespace cuflash::test
