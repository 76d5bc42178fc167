// CPU forward on packed variable-length batches against the float64 oracle,
// with the keys packed or in a paged cache (block_table). Every case includes
// an empty sequence and packed rows after cu_seqlens[B]: those rows hold NaN
// as input and must still hold the NaN poison after the call (the oracle
// marks them NaN, which the comparison requires to match).
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

void expect_forward_matches_oracle(const CaseSpec& spec) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(spec, rng.engine());
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

class CpuForwardVarlen : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardVarlen, MatchesOracle) { expect_forward_matches_oracle(GetParam()); }

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

// ----- keys in a paged cache (flash-attn's paged prefill) -------------------------
// The same packed queries, their keys read through a block table from pages
// handed out shuffled (page sizes 1, 16, 48 which is no power of two, 64, and
// 256, larger than most sequences), with guard pages and the slots after each
// sequence's keys NaN: the backend must read exactly the slots the table names.

CaseSpec in_pages(CaseSpec s, int page_size) {
  s.page_size = page_size;
  s.label += "_page" + std::to_string(page_size);
  return s;
}

class CpuForwardPagedVarlen : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardPagedVarlen, MatchesOracle) { expect_forward_matches_oracle(GetParam()); }

// Reading keys through pages changes where they come from, nothing else: the
// backend and the oracle give the same bits as for the keys packed.
TEST_P(CpuForwardPagedVarlen, SameBitsAsPackedKeys) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase paged(GetParam(), rng.engine());
  AttentionCase packed = paged.with_packed_keys();
  const AttentionOptions options = paged.options(Backend::cpu);
  ASSERT_TRUE(attention_forward(paged.forward_args(), options).ok());
  ASSERT_TRUE(attention_forward(packed.forward_args(), options).ok());
  EXPECT_TRUE(same_bytes(paged.out, packed.out)) << "out differs from the packed call's";
  EXPECT_TRUE(same_bytes(paged.lse, packed.lse)) << "lse differs from the packed call's";

  oracle::ForwardResult from_pages, from_packed;
  ASSERT_TRUE(oracle::forward_float64(paged.forward_args(), options, &from_pages).ok());
  ASSERT_TRUE(oracle::forward_float64(packed.forward_args(), options, &from_packed).ok());
  const auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
    return true;
  };
  EXPECT_TRUE(same(from_pages.out, from_packed.out)) << "the oracle's out differs from the packed call's";
  EXPECT_TRUE(same(from_pages.lse, from_packed.lse)) << "the oracle's lse differs from the packed call's";
}

std::vector<CaseSpec> paged_varlen_cases() {
  std::vector<CaseSpec> cases;
  CaseSpec s;
  cases.push_back(in_pages(varlen("self", kSelfLens, kSelfLens), 16));
  s = varlen("cross_causal", kCrossQ, kCrossK);  // bottom-right per sequence; sequence 3 sees no key
  s.options.causal = true;
  cases.push_back(in_pages(s, 1));
  cases.push_back(in_pages(s, 48));
  s = varlen("cross_window_3_2", kCrossQ, kCrossK);
  s.options.window_left = 3;
  s.options.window_right = 2;
  cases.push_back(in_pages(s, 16));
  s = varlen("cross_gqa8_bhsd", kCrossQ, kCrossK, 8, 1);
  s.bhsd = true;
  cases.push_back(in_pages(s, 64));
  s = varlen("self_softcap_alibi_per_batch_shared_page", kSelfLens, kSelfLens);
  s.options.softcap = 2.0f;
  s.alibi = AlibiKind::per_batch;
  s.share_first_page = true;  // a common prefix: every sequence's first page is sequence 0's
  cases.push_back(in_pages(s, 16));
  s = varlen("self_padded_scale_no_lse", kSelfLens, kSelfLens, 2, 2, 40);
  s.row_padding = 7;
  s.options.softmax_scale = 0.4f;
  s.with_lse = false;
  cases.push_back(in_pages(s, 16));
  s = varlen("long_mixed_causal_q_shorter", {1, 130, 0, 255, 40}, {200, 130, 17, 255, 300}, 2, 1, 128);
  s.options.causal = true;
  s.extra_rows = 0;
  cases.push_back(in_pages(s, 48));
  cases.push_back(in_pages(s, 256));
  s = varlen("no_keys_at_all", {3, 4}, {0, 0});
  cases.push_back(in_pages(s, 16));
  return for_dtypes(cases, kAllDtypes);
}

INSTANTIATE_TEST_SUITE_P(PagedVarlen, CpuForwardPagedVarlen, ::testing::ValuesIn(paged_varlen_cases()),
                         CaseSpecName());

}  // namespace
}  // namespace cuflash::test
