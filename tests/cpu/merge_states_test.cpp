// merge_states on the CPU: two attentions over disjoint halves of the keys,
// merged, equal the attention over all keys; the merge formula on random
// states (large lse values, rows with -inf on one or both sides); in place.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "common/attention_check.hpp"
#include "cuflash/merge_states.hpp"

namespace cuflash::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The first `count` keys starting at `first` of a dense [B, Sk, H, D] tensor, as a view.
TensorView key_range(const HostTensor& t, std::int64_t first, std::int64_t count) {
  TensorView v = t.view();
  v.data = static_cast<char*>(v.data) + first * v.strides[1] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[1] = count;
  return v;
}

struct MergeTensors {
  HostTensor out_a, lse_a, out_b, lse_b, out, lse;
  MergeArgs args() const { return {out_a.view(), lse_a.view(), out_b.view(), lse_b.view(), out.view(), lse.view()}; }
};

// out/lse of merging the stored (already rounded) states, in double.
void reference_merge(const MergeTensors& m, std::vector<double>* out, std::vector<double>* lse) {
  const auto& shape = m.out_a.shape();  // [B, S, H, D]
  const std::int64_t B = shape[0], S = shape[1], H = shape[2], D = shape[3];
  out->assign(m.out_a.numel(), 0.0);
  lse->assign(m.lse_a.numel(), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t h = 0; h < H; ++h) {
        const std::int64_t li = (b * H + h) * S + s;
        const double a = m.lse_a.get(li), c = m.lse_b.get(li);
        const double top = std::max(a, c);
        if (top == -kInf) {
          (*lse)[li] = -kInf;
          continue;  // out stays 0
        }
        const double merged = top + std::log(std::exp(a - top) + std::exp(c - top));
        (*lse)[li] = merged;
        const double wa = std::exp(a - merged), wb = std::exp(c - merged);
        for (std::int64_t d = 0; d < D; ++d) {
          const std::int64_t oi = ((b * S + s) * H + h) * D + d;
          (*out)[oi] = wa * m.out_a.get(oi) + wb * m.out_b.get(oi);
        }
      }
}

void expect_merge_close(const HostTensor& out, const HostTensor& lse, const std::vector<double>& ref_out,
                        const std::vector<double>& ref_lse, DType dtype) {
  const Tolerance tol = default_tolerance(dtype);
  const ErrorStats e_out = compare(out, ref_out), e_lse = compare(lse, ref_lse);
  EXPECT_EQ(e_out.mismatches, 0) << "out: " << e_out.describe();
  if (tol.out_max_abs_rel >= 0) {
    EXPECT_LE(e_out.max_abs, tol.out_max_abs_rel * e_out.ref_max_abs) << "out: " << e_out.describe();
  }
  EXPECT_LE(e_out.rel_l2, tol.out_rel_l2) << "out: " << e_out.describe();
  EXPECT_EQ(e_lse.mismatches, 0) << "lse: " << e_lse.describe();
  EXPECT_LE(e_lse.max_abs_floor1, tol.lse_max_abs) << "lse: " << e_lse.describe();
  record_error(dtype, "merge out rel_l2", e_out.rel_l2);
}

class CpuMergeStates : public ::testing::TestWithParam<DType> {};

std::string dtype_name_param(const ::testing::TestParamInfo<DType>& info) { return dtype_label(info.param); }

// Split-KV: attention over keys [0, 23) and [23, 50) separately, merged,
// equals attention over all 50 keys (no mask ties queries to positions here;
// softcap acts per score, so it splits too).
TEST_P(CpuMergeStates, SplitKeysEqualsFullAttention) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec spec = dense_case("split", 19, 50, 4, 2, 64);
  spec.dtype = GetParam();
  spec.options.softcap = 4.0f;
  spec.options.backend = Backend::cpu;
  AttentionCase full(spec, rng.engine());
  oracle::ForwardResult want;
  ASSERT_TRUE(oracle::forward_float64(full.forward_args(), spec.options, &want).ok());

  MergeTensors m;
  for (HostTensor* o : {&m.out_a, &m.out_b, &m.out}) *o = HostTensor(spec.dtype, full.q.shape());
  for (HostTensor* l : {&m.lse_a, &m.lse_b, &m.lse}) *l = HostTensor(DType::f32, {2, 4, 19});
  for (auto [out, lse, first, count] : {std::tuple{&m.out_a, &m.lse_a, 0, 23}, std::tuple{&m.out_b, &m.lse_b, 23, 27}}) {
    ForwardArgs a = full.forward_args();
    a.k = key_range(full.k, first, count);
    a.v = key_range(full.v, first, count);
    a.out = out->view();
    a.lse = lse->view();
    const Status status = attention_forward(a, spec.options);
    ASSERT_TRUE(status.ok()) << status.to_string();
  }
  m.out.poison();
  m.lse.poison();
  const Status status = merge_states(m.args(), Backend::cpu);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_merge_close(m.out, m.lse, want.out, want.lse, spec.dtype);
}

// Random states; some rows have lse = -inf on side a, on side b, or on both.
MergeTensors random_states(DType dtype, std::mt19937& engine) {
  MergeTensors m;
  const std::vector<std::int64_t> out_shape = {2, 13, 3, 40}, lse_shape = {2, 3, 13};
  for (HostTensor* o : {&m.out_a, &m.out_b, &m.out}) *o = HostTensor(dtype, out_shape);
  for (HostTensor* l : {&m.lse_a, &m.lse_b, &m.lse}) *l = HostTensor(DType::f32, lse_shape);
  m.out_a.fill_normal(engine);
  m.out_b.fill_normal(engine);
  m.lse_a.fill_normal(engine, 3.0);
  m.lse_b.fill_normal(engine, 3.0);
  m.out.poison();
  m.lse.poison();
  // Row s of every (b, h): 0 -> a masked, 1 -> b masked, 2 -> both masked,
  // 3 -> both huge (exp overflows float), 4 -> both very negative (exp underflows).
  for (std::int64_t bh = 0; bh < 2 * 3; ++bh) {
    m.lse_a.set(bh * 13 + 0, -kInf);
    m.lse_b.set(bh * 13 + 1, -kInf);
    m.lse_a.set(bh * 13 + 2, -kInf);
    m.lse_b.set(bh * 13 + 2, -kInf);
    m.lse_a.set(bh * 13 + 3, 120.0);
    m.lse_b.set(bh * 13 + 3, 119.0);
    m.lse_a.set(bh * 13 + 4, -150.0);
    m.lse_b.set(bh * 13 + 4, -151.5);
  }
  return m;
}

TEST_P(CpuMergeStates, MatchesFormula) {
  CUFLASH_TEST_RNG(rng);
  MergeTensors m = random_states(GetParam(), rng.engine());
  std::vector<double> ref_out, ref_lse;
  reference_merge(m, &ref_out, &ref_lse);
  const Status status = merge_states(m.args(), Backend::cpu);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_merge_close(m.out, m.lse, ref_out, ref_lse, GetParam());
  // Both sides -inf: out exactly 0 and lse -inf (row 2 of every (b, h)).
  for (std::int64_t bh = 0; bh < 6; ++bh) EXPECT_EQ(m.lse.get(bh * 13 + 2), -kInf);
}

// out == out_a and lse == lse_a: each row is read before it is overwritten.
TEST_P(CpuMergeStates, InPlace) {
  CUFLASH_TEST_RNG(rng);
  MergeTensors m = random_states(GetParam(), rng.engine());
  std::vector<double> ref_out, ref_lse;
  reference_merge(m, &ref_out, &ref_lse);
  MergeArgs args = m.args();
  args.out = args.out_a;
  args.lse = args.lse_a;
  const Status status = merge_states(args, Backend::cpu);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_merge_close(m.out_a, m.lse_a, ref_out, ref_lse, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuMergeStates, ::testing::Values(DType::f32, DType::f16, DType::bf16),
                         dtype_name_param);

}  // namespace
}  // namespace cuflash::test
