// The float64 oracle checked on its own, so that it is not merely consistent
// with the backends: against softmaxes worked out by hand, across layouts
// holding the same problem, and its analytic gradients against central finite
// differences of its own forward.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "common/attention_case.hpp"
#include "common/kv_cache_cases.hpp"
#include "cpu/float64_oracle.hpp"
#include "common/test_tensors.hpp"

namespace cuflash::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One query [1, 0] and two keys [1, 0], [0, 1] (scale 1): raw scores 1 and 0.
struct TwoKeyCase {
  HostTensor q = HostTensor::from_f32({1.0f, 0.0f}, {1, 1, 1, 2});
  HostTensor k = HostTensor::from_f32({1.0f, 0.0f, 0.0f, 1.0f}, {1, 2, 1, 2});
  HostTensor v = HostTensor::from_f32({1.0f, 2.0f, 3.0f, -1.0f}, {1, 2, 1, 2});
  HostTensor out = HostTensor(DType::f32, {1, 1, 1, 2});
  HostTensor lse = HostTensor(DType::f32, {1, 1, 1});
  HostTensor slopes = HostTensor::from_f32({0.5f}, {1});

  ForwardArgs args(bool alibi = false) const {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    if (alibi) a.alibi_slopes = slopes.view();
    return a;
  }

  // out and lse of a softmax over the two final scores s0, s1.
  static void expect_softmax(const oracle::ForwardResult& r, double s0, double s1) {
    const double sum = std::exp(s0) + std::exp(s1);
    const double p0 = std::exp(s0) / sum, p1 = std::exp(s1) / sum;
    ASSERT_EQ(r.out.size(), 2u);
    EXPECT_NEAR(r.out[0], p0 * 1.0 + p1 * 3.0, 1e-15);
    EXPECT_NEAR(r.out[1], p0 * 2.0 + p1 * -1.0, 1e-15);
    ASSERT_EQ(r.lse.size(), 1u);
    EXPECT_NEAR(r.lse[0], std::log(sum), 1e-15);
  }
};

// A causal contiguous cache of one sequence (4 queries, 3 appended keys, 4
// query heads over 2 kv heads of dim 8, a left window, ALiBi) for the oracle's
// own checks.
CaseSpec kv_cache_case_for_oracle(std::vector<int> cached, std::vector<int> leftpad) {
  CaseSpec s = kv_cache_case("oracle_cache", 0, 4, 3, std::move(cached));
  s.head_dim = 8;
  s.leftpad = std::move(leftpad);
  s.options.window_left = 12;
  s.alibi = AlibiKind::per_head;
  return s;
}

AttentionOptions scale_one() {
  AttentionOptions o;
  o.softmax_scale = 1.0f;
  return o;
}

TEST(Oracle, HandComputedSoftmax) {
  TwoKeyCase c;
  oracle::ForwardResult r;
  ASSERT_TRUE(oracle::forward_float64(c.args(), scale_one(), &r).ok());
  TwoKeyCase::expect_softmax(r, 1.0, 0.0);
}

TEST(Oracle, HandComputedScaleSoftcapAlibi) {
  TwoKeyCase c;
  oracle::ForwardResult r;
  AttentionOptions o;
  o.softmax_scale = 0.5f;
  ASSERT_TRUE(oracle::forward_float64(c.args(), o, &r).ok());
  TwoKeyCase::expect_softmax(r, 0.5, 0.0);

  o.softmax_scale = 2.0f;
  o.softcap = 1.5f;  // 1.5 * tanh(2 / 1.5), and 1.5 * tanh(0) = 0
  ASSERT_TRUE(oracle::forward_float64(c.args(), o, &r).ok());
  TwoKeyCase::expect_softmax(r, 1.5 * std::tanh(2.0 / 1.5), 0.0);

  // One query against two keys: offset 1, so key 0 is at distance 1 and key 1 at 0.
  ASSERT_TRUE(oracle::forward_float64(c.args(true), scale_one(), &r).ok());
  TwoKeyCase::expect_softmax(r, 1.0 - 0.5, 0.0);
}

TEST(Oracle, HandComputedMasks) {
  TwoKeyCase c;
  oracle::ForwardResult r;
  // window_left 0 with one query: only the last key (j = offset = 1) is visible.
  AttentionOptions o = scale_one();
  o.window_left = 0;
  ASSERT_TRUE(oracle::forward_float64(c.args(), o, &r).ok());
  EXPECT_EQ(r.out[0], 3.0);
  EXPECT_EQ(r.out[1], -1.0);
  EXPECT_EQ(r.lse[0], 0.0);

  // A window ending before the first key: the row sees nothing.
  o.window_left = -1;
  o.window_right = 0;
  HostTensor q2 = HostTensor::from_f32({1, 0, 0, 1, 1, 1}, {1, 3, 1, 2});
  HostTensor out2(DType::f32, {1, 3, 1, 2}), lse2(DType::f32, {1, 1, 3});
  ForwardArgs a = c.args();
  a.q = q2.view();
  a.out = out2.view();
  a.lse = lse2.view();
  o.causal = true;  // three queries, two keys: offset -1, so query 0 sees no key
  ASSERT_TRUE(oracle::forward_float64(a, o, &r).ok());
  EXPECT_EQ(r.lse[0], -kInf);
  EXPECT_EQ(r.out[0], 0.0);
  EXPECT_EQ(r.out[1], 0.0);
  // Query 1 sees key 0 alone: out = v0, lse = its score (q1 . k0 = 0).
  EXPECT_EQ(r.out[2], 1.0);
  EXPECT_EQ(r.out[3], 2.0);
  EXPECT_EQ(r.lse[1], 0.0);
  // Query 2 = [1, 1] sees both keys, scores 1 and 1: the mean of v.
  EXPECT_NEAR(r.out[4], 2.0, 1e-15);
  EXPECT_NEAR(r.out[5], 0.5, 1e-15);
  EXPECT_NEAR(r.lse[2], 1.0 + std::log(2.0), 1e-15);
}

// The same attention posed dense, varlen, as a contiguous KV cache with an
// append, and as a paged cache must give the same numbers.
TEST(Oracle, LayoutsAgree) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec dense_spec = dense_case("", 5, 11, 4, 2, 8, 1);
  dense_spec.options.causal = true;
  dense_spec.alibi = AlibiKind::per_head;
  AttentionCase dense(dense_spec, rng.engine());
  oracle::ForwardResult want;
  ASSERT_TRUE(oracle::forward_float64(dense.forward_args(), dense_spec.options, &want).ok());

  auto copy_rows = [](const HostTensor& from, HostTensor& to, std::int64_t to_first, std::int64_t count) {
    const std::int64_t row = from.shape()[from.shape().size() - 1] * from.shape()[from.shape().size() - 2];
    for (std::int64_t e = 0; e < count * row; ++e) to.set(to_first * row + e, from.get(e));
  };
  auto check = [&](AttentionCase& other, const char* what) {
    SCOPED_TRACE(what);
    copy_rows(dense.q, other.q, 0, 5);
    other.alibi.assign(dense.alibi.to_doubles());
    oracle::ForwardResult got;
    ASSERT_TRUE(oracle::forward_float64(other.forward_args(), dense_spec.options, &got).ok());
    for (std::size_t i = 0; i < want.out.size(); ++i) ASSERT_EQ(got.out[i], want.out[i]) << "out " << i;
    for (std::size_t i = 0; i < want.lse.size(); ++i) ASSERT_EQ(got.lse[i], want.lse[i]) << "lse " << i;
  };

  CaseSpec varlen_spec = dense_spec;
  varlen_spec.layout = CaseLayout::varlen;
  varlen_spec.q_lens = {5};
  varlen_spec.kv_lens = {11};
  AttentionCase varlen(varlen_spec, rng.engine());
  copy_rows(dense.k, varlen.k, 0, 11);
  copy_rows(dense.v, varlen.v, 0, 11);
  check(varlen, "varlen");

  // Contiguous cache: 7 keys cached, 4 appended from k_new.
  CaseSpec cache_spec = dense_spec;
  cache_spec.layout = CaseLayout::kv_cache;
  cache_spec.cached_lens = {7};
  cache_spec.new_len = 4;
  AttentionCase cache(cache_spec, rng.engine());
  copy_rows(dense.k, cache.k, 0, 7);
  copy_rows(dense.v, cache.v, 0, 7);
  for (std::int64_t e = 0; e < 4 * 16; ++e) {
    cache.k_new.set(e, dense.k.get(7 * 16 + e));
    cache.v_new.set(e, dense.v.get(7 * 16 + e));
  }
  const HostTensor cache_before = cache.k;
  check(cache, "contiguous cache with append");
  EXPECT_TRUE(same_bytes(cache_before, cache.k)) << "the oracle must not write the cache";

  // Paged, page size 3 (four pages, shuffled), all 11 keys cached.
  CaseSpec paged_spec = dense_spec;
  paged_spec.layout = CaseLayout::kv_cache;
  paged_spec.cached_lens = {11};
  paged_spec.page_size = 3;
  AttentionCase paged(paged_spec, rng.engine());
  for (int j = 0; j < 11; ++j) {
    const AttentionCase::CacheRow r = paged.cache_row(0, j);
    for (std::int64_t e = 0; e < 16; ++e) {
      paged.k.set((r.outer * 3 + r.pos) * 16 + e, dense.k.get(j * 16 + e));
      paged.v.set((r.outer * 3 + r.pos) * 16 + e, dense.v.get(j * 16 + e));
    }
  }
  check(paged, "paged cache");
}

// A KV cache's leftpad l is the same call on the cache from row l on, with l
// keys fewer cached: masks, windows and ALiBi keep their bottom-right alignment.
TEST(Oracle, LeftpadIsTheCacheFromThatRow) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec padded_spec = kv_cache_case_for_oracle({20}, {6});
  AttentionCase padded(padded_spec, rng.engine());
  CaseSpec shifted_spec = kv_cache_case_for_oracle({14}, {});
  AttentionCase shifted(shifted_spec, rng.engine());
  shifted.q.assign(padded.q.to_doubles());
  shifted.k_new.assign(padded.k_new.to_doubles());
  shifted.v_new.assign(padded.v_new.to_doubles());
  shifted.alibi.assign(padded.alibi.to_doubles());
  const std::int64_t row = 2 * 8;  // heads_kv x head_dim
  for (std::int64_t e = 0; e < 14 * row; ++e) {
    shifted.k.set(e, padded.k.get(6 * row + e));
    shifted.v.set(e, padded.v.get(6 * row + e));
  }
  oracle::ForwardResult want, got;
  ASSERT_TRUE(oracle::forward_float64(shifted.forward_args(), shifted_spec.options, &want).ok());
  ASSERT_TRUE(oracle::forward_float64(padded.forward_args(), padded_spec.options, &got).ok());
  for (std::size_t i = 0; i < want.out.size(); ++i) ASSERT_EQ(got.out[i], want.out[i]) << "out " << i;
  for (std::size_t i = 0; i < want.lse.size(); ++i) ASSERT_EQ(got.lse[i], want.lse[i]) << "lse " << i;
}

// The appended key [1, 2, 3, 4] at cache row 2, whose angles are 90 degrees
// (cos 0, sin 1) for pair 0 and 0 for pair 1: GPT-NeoX pairs columns (0, 2)
// and (1, 3), GPT-J (0, 1) and (2, 3).
TEST(Oracle, RotaryTurnsEachPairByItsAngle) {
  for (const bool interleaved : {false, true}) {
    SCOPED_TRACE(interleaved ? "interleaved" : "neox");
    CUFLASH_TEST_RNG(rng);
    CaseSpec spec = kv_cache_case("rotary_by_hand", 0, 1, 1, {2});
    spec.heads_q = spec.heads_kv = 1;
    spec.head_dim = 4;
    spec.rotary_dim = 4;
    spec.rotary_interleaved = interleaved;
    AttentionCase c(spec, rng.engine());
    c.k_new.assign({1.0, 2.0, 3.0, 4.0});
    c.rotary_cos.set(2 * 2 + 0, 0.0);
    c.rotary_sin.set(2 * 2 + 0, 1.0);
    c.rotary_cos.set(2 * 2 + 1, 1.0);
    c.rotary_sin.set(2 * 2 + 1, 0.0);
    oracle::ForwardResult r;
    ASSERT_TRUE(oracle::forward_float64(c.forward_args(), spec.options, &r).ok());
    const std::vector<double> want = interleaved ? std::vector<double>{-2.0, 1.0, 3.0, 4.0}
                                                 : std::vector<double>{-3.0, 2.0, 1.0, 4.0};
    EXPECT_EQ(r.k_appended, want);
  }
}

// ----- gradients against finite differences ------------------------------

// loss = sum(out * dout) over the rows that belong to a sequence.
double oracle_loss(const AttentionCase& c) {
  oracle::ForwardResult r;
  const Status status = oracle::forward_float64(c.forward_args(), c.spec().options, &r);
  EXPECT_TRUE(status.ok()) << status.to_string();
  double loss = 0.0;
  for (std::size_t i = 0; i < r.out.size(); ++i)
    if (!std::isnan(r.out[i])) loss += r.out[i] * c.dout.get(static_cast<std::int64_t>(i));
  return loss;
}

// Central difference of the loss along every element of `t`. The tensors are
// f32, so the perturbation actually applied is read back rather than assumed.
std::vector<double> finite_difference(AttentionCase& c, HostTensor& t) {
  std::vector<double> grad(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = t.get(i);
    const double h = 1e-4 * std::max(1.0, std::abs(x));
    t.set(i, x + h);
    const double up = t.get(i);
    const double loss_up = oracle_loss(c);
    t.set(i, x - h);
    const double down = t.get(i);
    const double loss_down = oracle_loss(c);
    t.set(i, x);
    grad[i] = (loss_up - loss_down) / (up - down);
  }
  return grad;
}

void expect_close(const std::vector<double>& analytic, const std::vector<double>& numeric, const char* name) {
  double err2 = 0.0, ref2 = 0.0;
  for (std::size_t i = 0; i < analytic.size(); ++i) {
    err2 += (analytic[i] - numeric[i]) * (analytic[i] - numeric[i]);
    ref2 += numeric[i] * numeric[i];
  }
  EXPECT_GT(ref2, 0.0) << name << ": all-zero gradient, the case tests nothing";
  EXPECT_LE(std::sqrt(err2 / ref2), 1e-6) << name << ": analytic vs finite differences, rel-L2";
}

class OracleGradient : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(OracleGradient, MatchesFiniteDifferences) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  oracle::ForwardResult fwd;
  ASSERT_TRUE(oracle::forward_float64(c.forward_args(), c.spec().options, &fwd).ok());
  c.set_forward_outputs(fwd.out, fwd.lse);
  oracle::BackwardResult analytic;
  const Status status = oracle::backward_float64(c.backward_args(), c.spec().options, &analytic);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_close(analytic.dq, finite_difference(c, c.q), "dq");
  ASSERT_EQ(analytic.dq_terms.size(), analytic.dq.size());
  for (std::size_t i = 0; i < analytic.dq.size(); ++i)
    EXPECT_LE(std::abs(analytic.dq[i]), analytic.dq_terms[i] * (1.0 + 1e-12)) << "dq_terms bound dq, element " << i;
  expect_close(analytic.dk, finite_difference(c, c.k), "dk");
  expect_close(analytic.dv, finite_difference(c, c.v), "dv");
}

// One query over two keys at D = 1: a row's dS sums to 0, so dS_2 = -dS_1,
// dq = scale dS_1 (k_1 - k_2) and dq_terms = scale |dS_1| (|k_1| + |k_2|).
TEST(OracleDqTerms, AreTheTermsOfTheCancellingSum) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(dense_case("two_keys", 1, 2, 1, 1, 1, /*batch=*/1), rng.engine());
  oracle::ForwardResult fwd;
  ASSERT_TRUE(oracle::forward_float64(c.forward_args(), c.spec().options, &fwd).ok());
  c.set_forward_outputs(fwd.out, fwd.lse);
  oracle::BackwardResult r;
  ASSERT_TRUE(oracle::backward_float64(c.backward_args(), c.spec().options, &r).ok());
  ASSERT_EQ(r.dq.size(), 1u);
  ASSERT_EQ(r.dq_terms.size(), 1u);
  const double k1 = c.k.get(0), k2 = c.k.get(1);
  EXPECT_GT(r.dq_terms[0], 0.0);
  EXPECT_NEAR(r.dq_terms[0] * std::abs(k1 - k2), std::abs(r.dq[0]) * (std::abs(k1) + std::abs(k2)),
              1e-12 * r.dq_terms[0] * (std::abs(k1) + std::abs(k2)));
}

std::vector<CaseSpec> gradient_cases() {
  std::vector<CaseSpec> cases;
  CaseSpec base = dense_case("", 3, 5, 2, 1, 4);
  base.poison_unused = false;  // every element is perturbed, so every element must be a number

  CaseSpec s = base;
  s.label = "dense_gqa";
  cases.push_back(s);
  s.label = "causal_softcap_alibi";
  s.options.causal = true;
  s.options.softcap = 1.0f;
  s.options.softmax_scale = 1.5f;  // scores large enough that the cap bends them
  s.alibi = AlibiKind::per_batch;
  cases.push_back(s);
  s = base;
  s.label = "window_q_longer";
  s.q_len = 5;
  s.kv_len = 3;
  s.options.window_left = 1;
  s.options.window_right = 0;
  cases.push_back(s);
  s = base;
  s.label = "offset_window_alibi";
  s.options.window_left = 1;
  s.options.window_right = 1;
  s.options.diagonal_offset = 2;
  s.alibi = AlibiKind::per_head;
  cases.push_back(s);
  s = base;
  s.label = "varlen";
  s.layout = CaseLayout::varlen;
  s.q_lens = {2, 0, 3};
  s.kv_lens = {3, 2, 4};
  s.extra_rows = 1;
  s.options.causal = true;
  cases.push_back(s);
  // Sequence 1 reuses sequence 0's first page: its keys' gradients add up.
  s = base;
  s.label = "paged_shared_page";
  s.layout = CaseLayout::kv_cache;
  s.cached_lens = {5, 4};
  s.page_size = 2;
  s.share_first_page = true;
  s.guard_pages = 1;
  cases.push_back(s);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Tiny, OracleGradient, ::testing::ValuesIn(gradient_cases()), CaseSpecName());

}  // namespace
}  // namespace cuflash::test
