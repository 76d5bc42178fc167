// CPU backward against the oracle's analytic float64 gradients (dq, dk, dv),
// over dense, varlen and KV-cache layouts and the score options; plus the
// deterministic flag (two runs bitwise equal).
#include <gtest/gtest.h>

#include "common/attention_check.hpp"

namespace cuflash::test {
namespace {

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

// Dense backward cases: 2 sequences, by default 4 query heads over 2 KV heads of dimension 64.
CaseSpec dense(std::string label, int q_len, int kv_len, int heads_q = 4, int heads_kv = 2, int head_dim = 64) {
  return dense_case(std::move(label), q_len, kv_len, heads_q, heads_kv, head_dim);
}

class CpuBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuBackward, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_backward(c, runner);
}

std::vector<CaseSpec> dense_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(dense("plain", 33, 33));
  add(dense("q_shorter", 17, 70));
  for (CaseSpec causal : {
           dense("causal", 33, 33),
           dense("causal_q_longer", 40, 17),  // rows that see nothing: dq = 0 there
           dense("causal_q_shorter", 17, 40),
       }) {
    causal.options.causal = true;
    add(causal);
  }
  const CaseSpec base = dense("", 33, 41);
  add(variant(base, "window_5_3", [](CaseSpec& s) { s.options.window_left = 5; s.options.window_right = 3; }));
  add(variant(base, "causal_window_left_7", [](CaseSpec& s) { s.options.causal = true; s.options.window_left = 7; }));
  add(variant(base, "softcap_2", [](CaseSpec& s) { s.options.softcap = 2.0f; }));
  add(variant(base, "softcap_10_scale_0_5",
              [](CaseSpec& s) { s.options.softcap = 10.0f; s.options.softmax_scale = 0.5f; }));
  add(variant(base, "alibi_per_head", [](CaseSpec& s) { s.alibi = AlibiKind::per_head; }));
  add(variant(base, "alibi_per_batch_causal",
              [](CaseSpec& s) { s.alibi = AlibiKind::per_batch; s.options.causal = true; }));
  add(variant(base, "offset_causal_plus_12", [](CaseSpec& s) { s.options.causal = true; s.options.diagonal_offset = 12; }));
  add(variant(base, "offset_causal_minus_9", [](CaseSpec& s) { s.options.causal = true; s.options.diagonal_offset = -9; }));
  add(variant(base, "offset_window_4_2_alibi_plus_20", [](CaseSpec& s) {
    s.options.window_left = 4;
    s.options.window_right = 2;
    s.options.diagonal_offset = 20;
    s.alibi = AlibiKind::per_head;
  }));
  add(dense("gqa8", 25, 31, 8, 1));
  s = dense("bhsd", 25, 31);
  s.bhsd = true;
  add(s);
  s = dense("combined_gqa8_causal_softcap_alibi_padded", 29, 37, 8, 1);
  s.options.causal = true;
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_batch;
  s.row_padding = 3;
  add(s);
  return for_dtypes(cases, kAllDtypes);
}

std::vector<CaseSpec> head_dim_cases() {
  std::vector<CaseSpec> cases;
  for (int d : {32, 40, 64, 96, 128, 160, 192, 256}) cases.push_back(dense("d" + std::to_string(d), 13, 19, 2, 1, d));
  cases.push_back(dense("q255_k255", 255, 255, 1, 1, 64));
  cases.back().batch = 1;
  cases.back().options.causal = true;
  cases.push_back(dense("q1_k255", 1, 255, 2, 1, 64));
  // (Not kv_len 1: then dq = dk = 0 exactly, by cancellation, and a relative error means nothing.)
  cases.push_back(dense("q255_k2", 255, 2, 2, 1, 64));
  cases = for_dtypes(cases, {DType::f32, DType::bf16});
  cases.push_back(dense("q1024_k1024", 1024, 1024, 1, 1, 64));
  cases.back().batch = 1;
  return cases;
}

std::vector<CaseSpec> layout_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  // Varlen: an empty sequence, a query sequence with no keys, and packed rows
  // after cu_seqlens[B] (their dq, dk, dv must be written as 0).
  s = CaseSpec{};
  s.label = "varlen_causal";
  s.layout = CaseLayout::varlen;
  s.q_lens = {5, 0, 35, 7};
  s.kv_lens = {12, 3, 20, 0};
  s.extra_rows = 3;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.options.causal = true;
  add(s);
  s.label = "varlen_window_softcap_gqa";
  s.heads_q = 8;
  s.heads_kv = 1;
  s.options.causal = false;
  s.options.window_left = 4;
  s.options.window_right = 6;
  s.options.softcap = 2.0f;
  add(s);

  // Paged cache with a shuffled block table: dk/dv are shaped like the cache,
  // guard pages and unused slots get 0.
  s = CaseSpec{};
  s.label = "paged16_causal";
  s.layout = CaseLayout::kv_cache;
  s.cached_lens = {37, 0, 50};
  s.page_size = 16;
  s.q_len = 5;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.options.causal = true;
  add(s);
  // A page in two block tables: its keys' gradients accumulate from both.
  s.label = "paged16_shared_prefix_page_alibi";
  s.cached_lens = {37, 20, 50};
  s.share_first_page = true;
  s.alibi = AlibiKind::per_head;
  add(s);
  s.label = "paged1_gqa8";
  s.share_first_page = false;
  s.alibi = AlibiKind::none;
  s.page_size = 1;
  s.heads_q = 8;
  s.heads_kv = 1;
  add(s);
  s.label = "contiguous_cache_window";
  s.page_size = 0;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.options.causal = false;
  s.options.window_left = 10;
  s.options.window_right = 2;
  add(s);
  // cache_leftpad: the rows before it (NaN) get dk = dv = 0; sequence 1 has no key.
  s.label = "contiguous_cache_leftpad_window";
  s.leftpad = {5, 20, 49};
  add(s);
  return for_dtypes(cases, kAllDtypes);
}

INSTANTIATE_TEST_SUITE_P(Dense, CpuBackward, ::testing::ValuesIn(dense_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(HeadDims, CpuBackward, ::testing::ValuesIn(head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Layouts, CpuBackward, ::testing::ValuesIn(layout_cases()), CaseSpecName());

// deterministic = true: two runs give the same bits, including where GQA and
// shared pages make several contributions meet in one dk/dv element.
class CpuBackwardDeterministic : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuBackwardDeterministic, TwoRunsBitwiseEqual) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec spec = GetParam();
  spec.options.deterministic = true;
  AttentionCase c(spec, rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_backward(c, runner);
  const HostTensor dq = c.dq, dk = c.dk, dv = c.dv;
  c.dq.poison();
  c.dk.poison();
  c.dv.poison();
  const Status status = runner.backward(c, c.options(Backend::cpu));
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(same_bytes(dq, c.dq)) << "dq differs between two deterministic runs";
  EXPECT_TRUE(same_bytes(dk, c.dk)) << "dk differs between two deterministic runs";
  EXPECT_TRUE(same_bytes(dv, c.dv)) << "dv differs between two deterministic runs";
}

std::vector<CaseSpec> deterministic_cases() {
  CaseSpec gqa = dense("dense_gqa8_causal", 64, 64, 8, 1);
  gqa.options.causal = true;
  CaseSpec paged;
  paged.label = "paged16_shared_prefix";
  paged.layout = CaseLayout::kv_cache;
  paged.cached_lens = {40, 33, 50};
  paged.page_size = 16;
  paged.share_first_page = true;
  paged.q_len = 9;
  paged.heads_q = 4;
  paged.heads_kv = 1;
  return for_dtypes({gqa, paged}, {DType::f32, DType::bf16});
}

INSTANTIATE_TEST_SUITE_P(Deterministic, CpuBackwardDeterministic, ::testing::ValuesIn(deterministic_cases()),
                         CaseSpecName());

}  // namespace
}  // namespace cuflash::test
