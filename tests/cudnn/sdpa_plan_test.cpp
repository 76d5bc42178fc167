// The cuDNN backend's view of a call (src/cudnn/sdpa_plan.hpp), checked on
// the CPU: no cuDNN call is made, so this runs on any machine the backend is
// built on. Problems come from the real validation of host test cases.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "common/attention_case.hpp"
#include "common/kv_cache_cases.hpp"
#include "gpu/gpu_cases.hpp"
#include "cudnn_support.hpp"
#include "sdpa_plan.hpp"
#include "validate.hpp"

namespace cuflash::test {
namespace {

using detail::Layout;
using detail::Pass;
using detail::Problem;
using namespace detail::cudnn;

Problem forward_problem(const CaseSpec& spec) {
  std::mt19937 engine(7);
  AttentionCase c(spec, engine);
  Problem p;
  const Status status = detail::validate_forward(c.forward_args(), c.options(Backend::cudnn), nullptr, &p);
  EXPECT_TRUE(status.ok()) << status.to_string();
  // The host views of a case die with it; the plan only reads their shapes,
  // strides and, for the stats, the lse address alignment.
  return p;
}

Problem backward_problem(const CaseSpec& spec) {
  std::mt19937 engine(7);
  AttentionCase c(spec, engine);
  c.set_forward_outputs(std::vector<double>(c.out.numel(), 0.0), std::vector<double>(c.lse.numel(), 0.0));
  Problem p;
  const Status status = detail::validate_backward(c.backward_args(), c.options(Backend::cudnn), nullptr, &p);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return p;
}

CaseSpec bf16(CaseSpec s) {
  s.dtype = DType::bf16;
  return s;
}

void expect_dims(const TensorDesc& t, std::vector<std::int64_t> dims, std::vector<std::int64_t> strides) {
  EXPECT_TRUE(t.used);
  EXPECT_EQ(std::vector<std::int64_t>(t.dim, t.dim + 4), dims);
  EXPECT_EQ(std::vector<std::int64_t>(t.stride, t.stride + 4), strides);
}

TEST(CudnnPlan, DenseCausalSquareIsTopLeftWithoutExtras) {
  CaseSpec s = bf16(dense_case("square", 128, 128, 4, 2, 64, 2));
  s.options.causal = true;
  const SdpaPlan plan = make_plan(forward_problem(s));
  expect_dims(plan.tensor(Slot::q), {2, 4, 128, 64}, {128 * 4 * 64, 64, 4 * 64, 1});
  expect_dims(plan.tensor(Slot::k), {2, 2, 128, 64}, {128 * 2 * 64, 64, 2 * 64, 1});
  EXPECT_FALSE(plan.tensor(Slot::q).ragged);
  EXPECT_FALSE(plan.padding_mask);
  EXPECT_FALSE(plan.bottom_right);  // equal lengths: top-left, as PyTorch asks cuDNN
  EXPECT_EQ(plan.right_bound, 0);
  EXPECT_EQ(plan.left_bound, -1);
  EXPECT_TRUE(plan.generate_stats);
  EXPECT_EQ(plan.stats, StatsPlace::caller);
  expect_dims(plan.tensor(Slot::stats), {2, 4, 128, 1}, {4 * 128, 128, 1, 1});
  EXPECT_FALSE(plan.fix_empty_rows);
  EXPECT_FALSE(plan.needs_index_kernel());
  EXPECT_EQ(plan.scratch.bytes, 0u);
}

TEST(CudnnPlan, BhsdMemoryKeepsItsStrides) {
  CaseSpec s = bf16(dense_case("bhsd", 37, 53, 4, 2, 64, 2));
  s.bhsd = true;
  const SdpaPlan plan = make_plan(forward_problem(s));
  expect_dims(plan.tensor(Slot::q), {2, 4, 37, 64}, {4 * 37 * 64, 37 * 64, 64, 1});
  // Another memory order is another graph.
  CaseSpec bshd = s;
  bshd.bhsd = false;
  EXPECT_NE(graph_key(plan), graph_key(make_plan(forward_problem(bshd))));
}

TEST(CudnnPlan, MoreQueriesThanKeysGetsPaddingAndFixes) {
  CaseSpec s = bf16(dense_case("q_longer", 40, 17, 2, 1, 64, 2));
  s.options.causal = true;
  const SdpaPlan plan = make_plan(forward_problem(s));
  EXPECT_TRUE(plan.bottom_right);
  EXPECT_TRUE(plan.padding_mask);
  EXPECT_EQ(plan.q_lengths, LengthSource::constant);
  EXPECT_EQ(plan.kv_lengths, LengthSource::constant);
  EXPECT_EQ(plan.q_len_constant, 40);
  EXPECT_EQ(plan.kv_len_constant, 17);
  EXPECT_TRUE(plan.fix_empty_rows);  // queries 0..22 see no key
  EXPECT_NE(plan.scratch.q_lengths, SdpaPlan::kNone);
  EXPECT_NE(plan.scratch.kv_lengths, SdpaPlan::kNone);
  // The backward reads a sanitized copy of the stats.
  EXPECT_EQ(make_plan(backward_problem(s)).stats, StatsPlace::scratch_dense);
}

TEST(CudnnPlan, WindowsBecomeDiagonalBands) {
  CaseSpec s = bf16(dense_case("window", 37, 53, 4, 2, 64, 2));
  s.options.window_left = 8;
  s.options.window_right = 4;
  SdpaPlan plan = make_plan(forward_problem(s));
  EXPECT_EQ(plan.left_bound, 9);  // cuDNN keeps j > i + shift - left_bound
  EXPECT_EQ(plan.right_bound, 4);
  EXPECT_TRUE(plan.bottom_right);
  EXPECT_FALSE(plan.padding_mask);  // fewer queries than keys: no lengths needed
  EXPECT_FALSE(plan.fix_empty_rows);
  // Keys 0..7 are left of the first query's window: zero gradients.
  EXPECT_TRUE(make_plan(backward_problem(s)).fix_unseen_keys);
  s.options.window_left = -1;
  plan = make_plan(forward_problem(s));
  EXPECT_EQ(plan.left_bound, -1);
  EXPECT_FALSE(make_plan(backward_problem(s)).fix_unseen_keys);
}

TEST(CudnnPlan, VarlenIsRaggedWithBucketedLengths) {
  CaseSpec s = bf16(varlen_case("varlen", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 64, 3));
  s.options.causal = true;
  const Problem p = forward_problem(s);
  const SdpaPlan plan = make_plan(p);
  const TensorDesc& q = plan.tensor(Slot::q);
  EXPECT_TRUE(q.ragged);
  EXPECT_EQ(q.side, Side::q);
  EXPECT_EQ(q.dim[2], 64);  // max 35 rounds up to 64
  EXPECT_EQ(q.token_stride, 4 * 64);
  EXPECT_EQ(q.stride[2], 4 * 64);
  EXPECT_EQ(q.stride[1], 64);
  EXPECT_TRUE(plan.tensor(Slot::k).ragged);
  EXPECT_EQ(plan.tensor(Slot::k).side, Side::kv);
  EXPECT_EQ(plan.tensor(Slot::k).token_stride, 2 * 64);
  EXPECT_TRUE(plan.padding_mask);
  EXPECT_EQ(plan.q_lengths, LengthSource::from_cu_seqlens);
  EXPECT_TRUE(plan.bottom_right);
  EXPECT_EQ(plan.stats, StatsPlace::scratch_ragged);
  const TensorDesc& stats = plan.tensor(Slot::stats);
  EXPECT_TRUE(stats.ragged);
  EXPECT_EQ(stats.token_stride, 4);  // token-major [total_q, Hq]
  EXPECT_EQ(stats.stride[1], 1);
  EXPECT_TRUE(plan.fix_empty_rows);  // sequence 3 has queries but no key
  EXPECT_TRUE(plan.needs_index_kernel());

  // Scratch regions are disjoint and aligned.
  std::set<std::size_t> starts;
  for (std::size_t at : {plan.scratch.q_lengths, plan.scratch.kv_lengths, plan.scratch.stats}) starts.insert(at);
  for (int slot = 0; slot < kSlots; ++slot)
    if (plan.tensors[slot].ragged) starts.insert(plan.scratch.offsets[slot]);
  EXPECT_FALSE(starts.count(SdpaPlan::kNone));
  EXPECT_EQ(starts.size(), 8u);  // lengths x2, offsets for q, k, v, o, stats, and the stats
  for (std::size_t at : starts) EXPECT_EQ(at % 256, 0u);
  EXPECT_GE(plan.scratch.bytes, *starts.rbegin() + (p.q.shape[0] + 64) * 4 * sizeof(float));
}

TEST(CudnnPlan, VarlenGraphsAreSharedWithinALengthBucket) {
  CaseSpec a = bf16(varlen_case("a", {100, 20}, {100, 20}, 4, 2, 64, 0));
  CaseSpec b = bf16(varlen_case("b", {7, 120}, {90, 110}, 4, 2, 64, 0));
  EXPECT_EQ(graph_key(make_plan(forward_problem(a))), graph_key(make_plan(forward_problem(b))));
  CaseSpec c = bf16(varlen_case("c", {7, 130}, {90, 110}, 4, 2, 64, 0));
  EXPECT_NE(graph_key(make_plan(forward_problem(a))), graph_key(make_plan(forward_problem(c))));
  EXPECT_EQ(varlen_length_bucket(0), 64);
  EXPECT_EQ(varlen_length_bucket(64), 64);
  EXPECT_EQ(varlen_length_bucket(65), 128);
  EXPECT_EQ(varlen_length_bucket(4097), 8192);
}

TEST(CudnnPlan, KeyCoversWhatShapesTheGraphAndNotTheScale) {
  CaseSpec s = bf16(dense_case("key", 65, 130, 4, 2, 128, 2));
  s.options.causal = true;
  const auto key = graph_key(make_plan(forward_problem(s)));
  CaseSpec scaled = s;
  scaled.options.softmax_scale = 0.3f;  // passed by value at launch
  EXPECT_EQ(key, graph_key(make_plan(forward_problem(scaled))));
  CaseSpec f16 = s;
  f16.dtype = DType::f16;
  EXPECT_NE(key, graph_key(make_plan(forward_problem(f16))));
  CaseSpec no_lse = s;
  no_lse.with_lse = false;
  EXPECT_NE(key, graph_key(make_plan(forward_problem(no_lse))));
  EXPECT_NE(key, graph_key(make_plan(backward_problem(s))));
  CaseSpec deterministic = s;
  deterministic.options.deterministic = true;
  EXPECT_NE(graph_key(make_plan(backward_problem(s))), graph_key(make_plan(backward_problem(deterministic))));
  // The forward ignores deterministic.
  EXPECT_EQ(key, graph_key(make_plan(forward_problem(deterministic))));
}

TEST(CudnnPlan, PagedCacheReadsPagesThroughTheBlockTable) {
  CaseSpec s = bf16(kv_cache_case("paged", 16, 3, 0));
  const Problem p = forward_problem(s);
  const SdpaPlan plan = make_plan(p);
  EXPECT_TRUE(plan.paged);
  EXPECT_EQ(plan.page_table_cols, p.max_pages);
  EXPECT_EQ(plan.max_seq_len_kv, static_cast<std::int64_t>(p.max_pages) * 16);
  expect_dims(plan.tensor(Slot::k), {p.num_pages, 2, 16, 64}, {16 * 2 * 64, 64, 2 * 64, 1});
  EXPECT_TRUE(plan.padding_mask);
  EXPECT_EQ(plan.q_lengths, LengthSource::constant);
  EXPECT_EQ(plan.kv_lengths, LengthSource::caller_seqlens_k);
  EXPECT_EQ(plan.scratch.kv_lengths, SdpaPlan::kNone);
  EXPECT_TRUE(plan.bottom_right);
  EXPECT_TRUE(plan.fix_empty_rows);  // sequence 1 holds no key
}

TEST(CudnnPlan, ContiguousCacheIsPaddedDense) {
  CaseSpec s = bf16(kv_cache_case("contiguous", 0, 1, 0, {37, 5, 70}));
  const Problem p = forward_problem(s);
  const SdpaPlan plan = make_plan(p);
  EXPECT_FALSE(plan.paged);
  expect_dims(plan.tensor(Slot::k), {3, 2, p.cache_capacity, 64},
              {p.cache_capacity * 2 * 64, 64, 2 * 64, 1});
  EXPECT_EQ(plan.kv_lengths, LengthSource::caller_seqlens_k);
  EXPECT_FALSE(plan.fix_empty_rows);  // every sequence has keys and one query at its end
}

TEST(CudnnPlan, LengthsOnlyOnTheDeviceAssumeTheWorst) {
  CaseSpec s = bf16(varlen_case("unchecked", {5, 5}, {5, 5}, 4, 2, 64, 0));
  Problem p = backward_problem(s);
  EXPECT_FALSE(make_plan(p).fix_empty_rows);
  EXPECT_FALSE(make_plan(p).fix_unseen_keys);
  p.host_indices_valid = false;
  EXPECT_TRUE(make_plan(p).fix_empty_rows);
  EXPECT_TRUE(make_plan(p).fix_unseen_keys);
  EXPECT_EQ(graph_key(make_plan(p)), graph_key(make_plan(backward_problem(s))));
  EXPECT_EQ(make_plan(p).scratch.bytes, make_plan(backward_problem(s)).scratch.bytes);
}

// A scale <= 0 is refused by name before any cuDNN call (cudnn_support.cpp
// says why); a positive one passes this check and goes on to the device's.
TEST(CudnnSupport, RefusesNonPositiveSoftmaxScale) {
  for (const float scale : {0.0f, -0.125f}) {
    CaseSpec s = bf16(dense_case("scale", 64, 64, 2, 2, 64, 1));
    s.options.softmax_scale = scale;
    for (const Problem& p : {forward_problem(s), backward_problem(s)}) {
      const Status status = check_problem(p);
      EXPECT_EQ(status.code(), StatusCode::unsupported) << status.to_string();
      EXPECT_NE(status.message().find("softmax_scale"), std::string::npos) << status.to_string();
    }
  }
  CaseSpec positive = bf16(dense_case("scale", 64, 64, 2, 2, 64, 1));
  positive.options.softmax_scale = 0.125f;
  const Status status = check_problem(forward_problem(positive));
  EXPECT_EQ(status.to_string().find("softmax_scale"), std::string::npos) << status.to_string();
}

}  // namespace
}  // namespace cuflash::test
