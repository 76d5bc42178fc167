// Linear attention on the CPU backend against the float64 oracle (fresh random
// inputs, outputs poisoned with NaN first): the matrix of feature map x
// normalize x causal x layout x dtype (GQA, lengths around the 64-row chunk,
// empty varlen sequences, strided views), forward and backward; the oracle's
// gradients against its own finite differences; the decode step chained token
// by token; prefill in two halves; empty shapes; validation messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "backend.hpp"
#include "common/linear_case.hpp"
#include "common/test_tensors.hpp"
#include "cpu/linear_oracle.hpp"
#include "cuflash/cuflash.hpp"

namespace cuflash::test {
namespace {

const std::vector<int> kLengths = {1, 63, 64, 65, 200};


// rel-L2 against float64: outputs rounded to their dtype, fp32 arithmetic.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 5e-6;
    case DType::f16: return 1e-3;
    default: return 6e-3;
  }
}

void check_forward(LinearCase& c) {
  oracle::LinearForwardResult ref;
  ASSERT_TRUE(oracle::linear_forward_float64(c.forward_args(), c.options(Backend::cpu), &ref).ok());
  const Status status = linear_attention_forward(c.forward_args(), c.options(Backend::cpu));
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_close(c.out, ref.out, tolerance(c.spec.dtype), "out");
  if (!c.final_state.empty()) expect_close(c.final_state, ref.final_state, 2e-5, "final_state");
  if (!c.final_key_sum.empty()) expect_close(c.final_key_sum, ref.final_key_sum, 2e-5, "final_key_sum");
}

void check_backward(LinearCase& c) {
  oracle::LinearBackwardResult ref;
  ASSERT_TRUE(oracle::linear_backward_float64(c.backward_args(), c.options(Backend::cpu), &ref).ok());
  const Status status = linear_attention_backward(c.backward_args(), c.options(Backend::cpu));
  ASSERT_TRUE(status.ok()) << status.to_string();
  // Gradients sum more terms than outputs (and dk/dv over a GQA group): twice the room.
  const double tol = 2 * tolerance(c.spec.dtype);
  EXPECT_TRUE(all_written(c.dq, "dq"));
  EXPECT_TRUE(all_written(c.dk, "dk"));
  EXPECT_TRUE(all_written(c.dv, "dv"));
  const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  expect_close(c.dq, ref.dq, tol, "dq", scale);
  expect_close(c.dk, ref.dk, tol, "dk", scale);
  expect_close(c.dv, ref.dv, tol, "dv", scale);
  if (!c.dinitial_state.empty()) expect_close(c.dinitial_state, ref.dinitial_state, 4e-5, "dinitial_state");
  if (!c.dinitial_key_sum.empty()) expect_close(c.dinitial_key_sum, ref.dinitial_key_sum, 4e-5, "dinitial_key_sum");
}

// ---- The matrix ---------------------------------------------------------------------------------


std::string dtype_label(DType dtype) { return dtype_name(dtype); }

LinearSpec matrix_spec(const LinearMatrixParam& param) {
  const auto& [map, normalize, causal, varlen, dtype] = param;
  LinearSpec s;
  s.map = map;
  s.normalize = normalize;
  s.causal = causal;
  s.varlen = varlen;
  s.dtype = dtype;
  const int index = matrix_index(param);
  s.with_state = index % 2 == 1;
  if (varlen) {
    s.lengths = {1, 63, 0, 64, 65, 200, 0};
    s.trailing_rows = 3;
  } else {
    const int length = kLengths[index % kLengths.size()];
    s.lengths = {length, length};
    // One normalized row without a state is its value whatever q and k: their
    // gradients are 0 up to rounding, which says nothing. With a state they are not.
    if (length == 1 && normalize) s.with_state = true;
  }
  return s;
}

std::string matrix_name(const ::testing::TestParamInfo<LinearMatrixParam>& info) {
  const auto& [map, normalize, causal, varlen, dtype] = info.param;
  const LinearSpec s = matrix_spec(info.param);
  std::string name = map_label(map) + (normalize ? "_norm" : "") + (causal ? "_causal" : "_full") +
                     (varlen ? "_varlen" : "_dense" + std::to_string(s.lengths[0])) + "_" + dtype_label(dtype);
  return name + (s.with_state ? "_state" : "");
}

class LinearMatrix : public ::testing::TestWithParam<LinearMatrixParam> {};

TEST_P(LinearMatrix, ForwardMatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  LinearCase c(matrix_spec(GetParam()), rng.engine());
  check_forward(c);
}

TEST_P(LinearMatrix, BackwardMatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  LinearCase c(matrix_spec(GetParam()), rng.engine());
  check_backward(c);
}

INSTANTIATE_TEST_SUITE_P(Cpu, LinearMatrix,
                         ::testing::Combine(::testing::Values(FeatureMap::identity, FeatureMap::elu_plus_one,
                                                              FeatureMap::relu),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16)),
                         matrix_name);

// ---- Shapes beyond the matrix -----------------------------------------------------------------

TEST(LinearShapes, HeadsAndDims) {
  CUFLASH_TEST_RNG(rng);
  struct Shape {
    int heads_q, heads_kv, key_dim, value_dim;
  };
  // MHA, MQA, equal dims, Dv > Dk, a head dim of 1, wide dims (no padding anywhere).
  for (Shape shape : {Shape{3, 3, 32, 32}, Shape{6, 1, 8, 40}, Shape{2, 2, 1, 1}, Shape{2, 1, 130, 67}}) {
    for (bool causal : {true, false}) {
      LinearSpec s;
      s.heads_q = shape.heads_q;
      s.heads_kv = shape.heads_kv;
      s.key_dim = shape.key_dim;
      s.value_dim = shape.value_dim;
      s.causal = causal;
      s.map = FeatureMap::elu_plus_one;
      s.normalize = shape.key_dim > 1;  // with Dk = 1 a normalized output does not depend on q
      s.with_state = true;
      s.lengths = {66, 66};
      s.scale = 0.3f;
      SCOPED_TRACE(std::to_string(shape.heads_q) + "/" + std::to_string(shape.heads_kv) + " heads, Dk " +
                   std::to_string(shape.key_dim) + ", Dv " + std::to_string(shape.value_dim) +
                   (causal ? " causal" : ""));
      LinearCase forward(s, rng.engine());
      check_forward(forward);
      LinearCase backward(s, rng.engine());
      check_backward(backward);
    }
  }
}

TEST(LinearShapes, ContiguousDenseViews) {
  CUFLASH_TEST_RNG(rng);
  LinearSpec s;
  s.layout = MemoryLayout{};
  s.with_state = true;
  LinearCase forward(s, rng.engine());
  check_forward(forward);
  LinearCase backward(s, rng.engine());
  check_backward(backward);
}

// Zero extents: nothing to compute, but the final state still passes the initial one on.
TEST(LinearShapes, EmptyExtents) {
  CUFLASH_TEST_RNG(rng);
  for (bool normalize : {false, true}) {
    LinearSpec s;
    s.normalize = normalize;
    s.with_state = true;
    s.lengths = {0, 0};  // dense, seqlen 0
    LinearCase c(s, rng.engine());
    check_forward(c);
    EXPECT_EQ(c.final_state.to_doubles(), c.initial_state.to_doubles());
    check_backward(c);
    EXPECT_EQ(c.dinitial_state.to_doubles(), c.dfinal_state.to_doubles());
    if (normalize) EXPECT_EQ(c.dinitial_key_sum.to_doubles(), c.dfinal_key_sum.to_doubles());
  }
  LinearSpec no_batch;
  no_batch.lengths = {};
  LinearCase c(no_batch, rng.engine());
  check_forward(c);
  check_backward(c);
  LinearSpec no_heads;
  no_heads.heads_q = no_heads.heads_kv = 0;
  no_heads.with_state = true;
  LinearCase h(no_heads, rng.engine());
  check_forward(h);
  check_backward(h);
  LinearSpec no_sequences;  // varlen cu_seqlens = [0], rows left over
  no_sequences.varlen = true;
  no_sequences.lengths = {};
  no_sequences.trailing_rows = 2;
  LinearCase v(no_sequences, rng.engine());
  check_forward(v);
  check_backward(v);
}

// ---- The float64 oracle's gradients against its own finite differences --------------------------

// loss = Σ out·dout + Σ final_state·dfinal_state + Σ final_key_sum·dfinal_key_sum, in double.
double oracle_loss(const LinearCase& c) {
  oracle::LinearForwardResult r;
  EXPECT_TRUE(oracle::linear_forward_float64(c.forward_args(), c.options(Backend::cpu), &r).ok());
  double loss = 0.0;
  const std::vector<double> dout = c.dout.to_doubles();
  for (std::size_t i = 0; i < r.out.size(); ++i) loss += r.out[i] * dout[i];
  if (!c.dfinal_state.empty()) {
    const std::vector<double> ds = c.dfinal_state.to_doubles();
    for (std::size_t i = 0; i < ds.size(); ++i) loss += r.final_state[i] * ds[i];
  }
  if (!c.dfinal_key_sum.empty()) {
    const std::vector<double> dz = c.dfinal_key_sum.to_doubles();
    for (std::size_t i = 0; i < dz.size(); ++i) loss += r.final_key_sum[i] * dz[i];
  }
  return loss;
}

// Central differences over every element of `input`, with the step actually stored (f32).
std::vector<double> finite_differences(LinearCase& c, HostTensor& input) {
  constexpr double kStep = 1e-3;
  std::vector<double> grad(input.numel());
  for (std::int64_t i = 0; i < input.numel(); ++i) {
    const double x = input.get(i);
    input.set(i, x + kStep);
    const double up = input.get(i);
    const double loss_up = oracle_loss(c);
    input.set(i, x - kStep);
    const double down = input.get(i);
    const double loss_down = oracle_loss(c);
    input.set(i, x);
    grad[i] = (loss_up - loss_down) / (up - down);
  }
  return grad;
}

double relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

TEST(LinearOracle, GradientsMatchFiniteDifferences) {
  CUFLASH_TEST_RNG(rng);
  for (FeatureMap map : {FeatureMap::identity, FeatureMap::elu_plus_one, FeatureMap::relu})
    for (bool normalize : {false, true})
      for (bool causal : {true, false}) {
        LinearSpec s;
        s.map = map;
        s.normalize = normalize;
        s.causal = causal;
        s.lengths = {5};
        s.heads_q = 2;
        s.heads_kv = 1;
        s.key_dim = 3;
        s.value_dim = 2;
        s.with_state = true;
        s.layout = MemoryLayout{};
        SCOPED_TRACE(map_label(map) + (normalize ? " normalize" : "") + (causal ? " causal" : ""));
        LinearCase c(s, rng.engine());
        // relu has a kink at 0: keep every input away from it by more than the step.
        // A normalizer near 0 (identity features) makes differences meaningless:
        // there, positive q and k keep it away from 0.
        const bool positive = normalize && map == FeatureMap::identity;
        for (HostTensor* t : {&c.q, &c.k})
          for (std::int64_t i = 0; i < t->numel(); ++i) {
            const double x = t->get(i);
            if (positive) t->set(i, std::abs(x) + 0.2);
            else if (std::abs(x) < 0.05) t->set(i, x < 0 ? -0.1 : 0.1);
          }
        oracle::LinearBackwardResult grads;
        ASSERT_TRUE(oracle::linear_backward_float64(c.backward_args(), c.options(Backend::cpu), &grads).ok());
        EXPECT_LT(relative_difference(grads.dq, finite_differences(c, c.q)), 1e-4) << "dq";
        EXPECT_LT(relative_difference(grads.dk, finite_differences(c, c.k)), 1e-4) << "dk";
        EXPECT_LT(relative_difference(grads.dv, finite_differences(c, c.v)), 1e-4) << "dv";
        EXPECT_LT(relative_difference(grads.dinitial_state, finite_differences(c, c.initial_state)), 1e-4)
            << "dinitial_state";
        if (normalize)
          EXPECT_LT(relative_difference(grads.dinitial_key_sum, finite_differences(c, c.initial_key_sum)), 1e-4)
              << "dinitial_key_sum";
      }
}

// The oracle on hand-worked values: one sequence, one head, Dk = Dv = 1, identity,
// scale 1: out_t = q_t Σ_{s<=t} k_s v_s, normalized ÷ (q_t Σ_{s<=t} k_s + 1e-10).
TEST(LinearOracle, HandWorkedValues) {
  HostTensor q = HostTensor::from_f32({1.0f, 2.0f, -1.0f}, {1, 3, 1, 1});
  HostTensor k = HostTensor::from_f32({2.0f, 1.0f, 1.0f}, {1, 3, 1, 1});
  HostTensor v = HostTensor::from_f32({3.0f, -1.0f, 4.0f}, {1, 3, 1, 1});
  HostTensor out(DType::f32, {1, 3, 1, 1});
  LinearForwardArgs args;
  args.q = q.view();
  args.k = k.view();
  args.v = v.view();
  args.out = out.view();
  LinearAttentionOptions options;
  options.scale = 1.0f;
  oracle::LinearForwardResult r;
  ASSERT_TRUE(oracle::linear_forward_float64(args, options, &r).ok());
  EXPECT_EQ(r.out, (std::vector<double>{6.0, 2.0 * 5.0, -1.0 * 9.0}));
  EXPECT_EQ(r.final_state, std::vector<double>{9.0});
  EXPECT_EQ(r.final_key_sum, std::vector<double>{4.0});
  options.normalize = true;
  ASSERT_TRUE(oracle::linear_forward_float64(args, options, &r).ok());
  EXPECT_NEAR(r.out[0], 6.0 / 2.0, 1e-9);
  EXPECT_NEAR(r.out[1], 10.0 / 6.0, 1e-9);
  EXPECT_NEAR(r.out[2], -9.0 / -4.0, 1e-9);
  options.causal = false;  // every row sees all keys
  options.normalize = false;
  ASSERT_TRUE(oracle::linear_forward_float64(args, options, &r).ok());
  EXPECT_EQ(r.out, (std::vector<double>{9.0, 18.0, -9.0}));
  // relu of a negative query: numerator and normalizer 0, out 0 (the eps rule).
  options.feature_map = FeatureMap::relu;
  options.normalize = true;
  ASSERT_TRUE(oracle::linear_forward_float64(args, options, &r).ok());
  EXPECT_EQ(r.out[2], 0.0);
  // The CPU backend agrees on that row exactly.
  options.backend = Backend::cpu;
  ASSERT_TRUE(linear_attention_forward(args, options).ok());
  EXPECT_EQ(out.get(2), 0.0);
}

// ---- State chaining: the decode step and prefill in two halves ---------------------------------

// The chaining tests compare two fp32 computations: no zero is structural.
void expect_close_to_fp32(const HostTensor& got, const std::vector<double>& ref, double tol, const std::string& what) {
  expect_close(got, ref, tol, what, 0.0, /*exact_zeros=*/false);
}

HostTensor slice_rows(const HostTensor& t, std::int64_t first, std::int64_t count) {
  // A dense [B, S, H, D] tensor's rows [first, first + count), as a new contiguous tensor.
  const auto& shape = t.shape();
  HostTensor out(t.dtype(), {shape[0], count, shape[2], shape[3]});
  const std::int64_t inner = shape[2] * shape[3];
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t e = 0; e < inner; ++e)
        out.set((b * count + r) * inner + e, t.get((b * shape[1] + first + r) * inner + e));
  return out;
}

std::vector<double> rows_of(const HostTensor& t, std::int64_t first, std::int64_t count) {
  return slice_rows(t, first, count).to_doubles();
}

class LinearChaining : public ::testing::TestWithParam<std::tuple<FeatureMap, bool>> {
 protected:
  LinearSpec spec() const {
    LinearSpec s;
    s.map = std::get<0>(GetParam());
    s.normalize = std::get<1>(GetParam());
    s.lengths = {70, 70};
    s.heads_q = 4;
    s.heads_kv = 2;
    s.key_dim = 16;
    s.value_dim = 8;
    s.with_state = true;
    s.layout = MemoryLayout{};
    return s;
  }
};

// Token by token from the same initial state, each step's output is the chunked
// forward's row and the last state its final state. Steps alternate between
// updating in place and writing to a second state.
TEST_P(LinearChaining, DecodeStepsEqualTheChunkedForward) {
  CUFLASH_TEST_RNG(rng);
  LinearCase c(spec(), rng.engine());
  ASSERT_TRUE(linear_attention_forward(c.forward_args(), c.options(Backend::cpu)).ok());
  const bool normalize = c.spec.normalize;
  HostTensor state = c.initial_state, key_sum = c.initial_key_sum;
  HostTensor other_state(DType::f32, state.shape());
  HostTensor other_key_sum = normalize ? HostTensor(DType::f32, key_sum.shape()) : HostTensor();
  const std::int64_t length = c.rows;
  for (std::int64_t t = 0; t < length; ++t) {
    HostTensor q = slice_rows(c.q, t, 1), k = slice_rows(c.k, t, 1), v = slice_rows(c.v, t, 1);
    HostTensor out(c.spec.dtype, {c.batch, 1, c.spec.heads_q, c.spec.value_dim});
    out.poison();
    LinearStepArgs step;
    step.q = q.view();
    step.k = k.view();
    step.v = v.view();
    step.out = out.view();
    step.state = state.view();
    step.key_sum = key_sum.view();
    const bool in_place = t % 2 == 0;
    if (!in_place) {
      other_state.poison();
      step.state_out = other_state.view();
      if (normalize) {
        other_key_sum.poison();
        step.key_sum_out = other_key_sum.view();
      }
    }
    const Status status = linear_attention_step(step, c.options(Backend::cpu));
    ASSERT_TRUE(status.ok()) << status.to_string();
    if (!in_place) {
      std::swap(state, other_state);
      if (normalize) std::swap(key_sum, other_key_sum);
    }
    const std::vector<double> row = rows_of(c.out, t, 1);
    const ErrorStats st = compare_zeros_where(out, row, std::vector<bool>(row.size(), false));  // (fp32 against fp32)
    ASSERT_LE(st.rel_l2, 1e-5) << "token " << t << ": " << st.describe();
  }
  expect_close_to_fp32(state, c.final_state.to_doubles(), 1e-5, "state after the steps");
  if (normalize) expect_close_to_fp32(key_sum, c.final_key_sum.to_doubles(), 1e-5, "key sum after the steps");
}

// Forward: [0, split) with final_state, then [split, S) from it, equals one call.
// Backward: the second half's dinitial_state is the first half's dfinal_state.
TEST_P(LinearChaining, PrefillInTwoHalvesEqualsOneCall) {
  CUFLASH_TEST_RNG(rng);
  LinearCase full(spec(), rng.engine());
  ASSERT_TRUE(linear_attention_forward(full.forward_args(), full.options(Backend::cpu)).ok());
  ASSERT_TRUE(linear_attention_backward(full.backward_args(), full.options(Backend::cpu)).ok());
  const bool normalize = full.spec.normalize;
  const std::int64_t split = 29, length = full.rows;
  struct Half {
    HostTensor q, k, v, dout, out, dq, dk, dv;
  };
  auto half = [&](std::int64_t first, std::int64_t count) {
    Half h{slice_rows(full.q, first, count), slice_rows(full.k, first, count), slice_rows(full.v, first, count),
           slice_rows(full.dout, first, count), slice_rows(full.out, first, count), slice_rows(full.dq, first, count),
           slice_rows(full.dk, first, count), slice_rows(full.dv, first, count)};
    for (HostTensor* t : {&h.out, &h.dq, &h.dk, &h.dv}) t->poison();
    return h;
  };
  Half first = half(0, split), second = half(split, length - split);
  HostTensor middle_state(DType::f32, full.initial_state.shape());
  HostTensor middle_key_sum = normalize ? HostTensor(DType::f32, full.initial_key_sum.shape()) : HostTensor();
  HostTensor end_state(DType::f32, full.initial_state.shape());
  HostTensor end_key_sum = normalize ? HostTensor(DType::f32, full.initial_key_sum.shape()) : HostTensor();

  LinearForwardArgs a;
  a.q = first.q.view(), a.k = first.k.view(), a.v = first.v.view(), a.out = first.out.view();
  a.initial_state = full.initial_state.view(), a.initial_key_sum = full.initial_key_sum.view();
  a.final_state = middle_state.view(), a.final_key_sum = middle_key_sum.view();
  ASSERT_TRUE(linear_attention_forward(a, full.options(Backend::cpu)).ok());
  LinearForwardArgs b;
  b.q = second.q.view(), b.k = second.k.view(), b.v = second.v.view(), b.out = second.out.view();
  b.initial_state = middle_state.view(), b.initial_key_sum = middle_key_sum.view();
  b.final_state = end_state.view(), b.final_key_sum = end_key_sum.view();
  ASSERT_TRUE(linear_attention_forward(b, full.options(Backend::cpu)).ok());
  expect_close_to_fp32(first.out, rows_of(full.out, 0, split), 1e-5, "out, first half");
  expect_close_to_fp32(second.out, rows_of(full.out, split, length - split), 1e-5, "out, second half");
  expect_close_to_fp32(end_state, full.final_state.to_doubles(), 1e-5, "final_state");
  if (normalize) expect_close_to_fp32(end_key_sum, full.final_key_sum.to_doubles(), 1e-5, "final_key_sum");

  HostTensor dmiddle_state(DType::f32, full.initial_state.shape());
  HostTensor dmiddle_key_sum = normalize ? HostTensor(DType::f32, full.initial_key_sum.shape()) : HostTensor();
  HostTensor dstart_state(DType::f32, full.initial_state.shape());
  HostTensor dstart_key_sum = normalize ? HostTensor(DType::f32, full.initial_key_sum.shape()) : HostTensor();
  LinearBackwardArgs db;
  db.q = second.q.view(), db.k = second.k.view(), db.v = second.v.view(), db.dout = second.dout.view();
  db.initial_state = middle_state.view(), db.initial_key_sum = middle_key_sum.view();
  db.dfinal_state = full.dfinal_state.view(), db.dfinal_key_sum = full.dfinal_key_sum.view();
  db.dq = second.dq.view(), db.dk = second.dk.view(), db.dv = second.dv.view();
  db.dinitial_state = dmiddle_state.view(), db.dinitial_key_sum = dmiddle_key_sum.view();
  ASSERT_TRUE(linear_attention_backward(db, full.options(Backend::cpu)).ok());
  LinearBackwardArgs da;
  da.q = first.q.view(), da.k = first.k.view(), da.v = first.v.view(), da.dout = first.dout.view();
  da.initial_state = full.initial_state.view(), da.initial_key_sum = full.initial_key_sum.view();
  da.dfinal_state = dmiddle_state.view(), da.dfinal_key_sum = dmiddle_key_sum.view();
  da.dq = first.dq.view(), da.dk = first.dk.view(), da.dv = first.dv.view();
  da.dinitial_state = dstart_state.view(), da.dinitial_key_sum = dstart_key_sum.view();
  ASSERT_TRUE(linear_attention_backward(da, full.options(Backend::cpu)).ok());
  for (auto [what, got, whole] : {std::tuple{"dq", &first.dq, &full.dq}, std::tuple{"dk", &first.dk, &full.dk},
                                  std::tuple{"dv", &first.dv, &full.dv}})
    expect_close_to_fp32(*got, rows_of(*whole, 0, split), 2e-5, std::string(what) + ", first half");
  for (auto [what, got, whole] : {std::tuple{"dq", &second.dq, &full.dq}, std::tuple{"dk", &second.dk, &full.dk},
                                  std::tuple{"dv", &second.dv, &full.dv}})
    expect_close_to_fp32(*got, rows_of(*whole, split, length - split), 2e-5, std::string(what) + ", second half");
  expect_close_to_fp32(dstart_state, full.dinitial_state.to_doubles(), 2e-5, "dinitial_state");
  if (normalize) expect_close_to_fp32(dstart_key_sum, full.dinitial_key_sum.to_doubles(), 2e-5, "dinitial_key_sum");
}

INSTANTIATE_TEST_SUITE_P(Cpu, LinearChaining,
                         ::testing::Combine(::testing::Values(FeatureMap::identity, FeatureMap::elu_plus_one,
                                                              FeatureMap::relu),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<FeatureMap, bool>>& info) {
                           return map_label(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_norm" : "");
                         });

// ---- Validation ------------------------------------------------------------------------------

// A valid call that each test breaks in one place; a rejected call must name the
// argument and leave every output as poisoned.
class LinearBadInput : public ::testing::Test {
 protected:
  LinearBadInput() : rng_(), c_(base_spec(), rng_.engine()) {}

  static LinearSpec base_spec() {
    LinearSpec s;
    s.lengths = {10, 10};
    s.with_state = true;
    s.normalize = true;
    s.layout = MemoryLayout{};
    return s;
  }

  bool outputs_untouched() const {
    for (const HostTensor* t : {&c_.out, &c_.final_state, &c_.final_key_sum, &c_.dq, &c_.dk, &c_.dv,
                                &c_.dinitial_state, &c_.dinitial_key_sum})
      if (t->count_nan() != t->numel()) return false;
    return true;
  }

  void expect_rejected(const Status& status, const std::string& prefix, const std::string& fragment = "",
                       StatusCode code = StatusCode::invalid_argument) {
    EXPECT_EQ(status.code(), code) << status.to_string();
    EXPECT_EQ(status.message().rfind(prefix, 0), 0u) << "message \"" << status.message() << "\" does not start with \""
                                                      << prefix << "\"";
    EXPECT_NE(status.message().find(fragment), std::string::npos)
        << "message \"" << status.message() << "\" lacks \"" << fragment << "\"";
    EXPECT_TRUE(outputs_untouched()) << "an output was written";
  }

  void forward_rejects(const std::function<void(LinearForwardArgs&, LinearAttentionOptions&)>& breaking,
                       const std::string& prefix, const std::string& fragment = "") {
    LinearForwardArgs args = c_.forward_args();
    LinearAttentionOptions options = c_.options(Backend::cpu);
    breaking(args, options);
    expect_rejected(linear_attention_forward(args, options), prefix, fragment);
  }

  void backward_rejects(const std::function<void(LinearBackwardArgs&, LinearAttentionOptions&)>& breaking,
                        const std::string& prefix, const std::string& fragment = "") {
    LinearBackwardArgs args = c_.backward_args();
    LinearAttentionOptions options = c_.options(Backend::cpu);
    breaking(args, options);
    expect_rejected(linear_attention_backward(args, options), prefix, fragment);
  }

  TestRng rng_;
  LinearCase c_;
};

TEST_F(LinearBadInput, ValidCallsSucceed) {
  EXPECT_TRUE(linear_attention_forward(c_.forward_args(), c_.options(Backend::cpu)).ok());
  EXPECT_TRUE(linear_attention_backward(c_.backward_args(), c_.options(Backend::cpu)).ok());
}

TEST_F(LinearBadInput, Forward) {
  HostTensor f16_state(DType::f16, c_.initial_state.shape());
  HostTensor small_state(DType::f32, {2, 2, 16, 23});
  HostTensor offsets(DType::i32, {3});
  forward_rejects([](auto& a, auto&) { a.q = {}; }, "q: required");
  forward_rejects([&](auto& a, auto&) { a.q = make_view(c_.q.view().data, DType::f32, {2, 10, 64}); }, "q: expected rank 4");
  forward_rejects([&](auto& a, auto&) { a.k.dtype = DType::f16; }, "k: expected dtype f32");
  forward_rejects([&](auto& a, auto&) { a.k.shape[3] = 8; }, "k: key_dim");
  forward_rejects([&](auto& a, auto&) { a.k.shape[2] = 3; }, "k: heads_kv");
  forward_rejects([&](auto& a, auto&) { a.k.shape[1] = 9; }, "k: dim 1 expected 10");
  forward_rejects([&](auto& a, auto&) { a.v.shape[2] = 1; }, "v: dim 2 expected 2");
  forward_rejects([&](auto& a, auto&) { a.out.shape[3] = 16; }, "out: expected shape [2, 10, 4, 24]");
  forward_rejects([&](auto& a, auto&) { a.out = {}; }, "out: required");
  forward_rejects([&](auto& a, auto&) { a.initial_state = f16_state.view(); }, "initial_state: expected dtype f32");
  forward_rejects([&](auto& a, auto&) { a.initial_state = small_state.view(); }, "initial_state: dim 3 (value_dim)");
  forward_rejects([&](auto& a, auto& o) { o.normalize = false; }, "initial_key_sum: given without normalize");
  forward_rejects([&](auto& a, auto& o) { a.initial_key_sum = {}; a.final_key_sum.shape[2] = 4; },
                  "final_key_sum: dim 2 (key_dim)");
  forward_rejects([&](auto& a, auto&) { a.final_state = a.initial_state; }, "final_state: overlaps initial_state");
  forward_rejects([&](auto& a, auto&) { a.final_state.data = a.out.data; }, "out: overlaps final_state");
  forward_rejects([&](auto& a, auto& o) { o.scale = std::nanf(""); }, "scale: expected a finite number");
  forward_rejects([&](auto& a, auto& o) { o.feature_map = static_cast<FeatureMap>(7); }, "feature_map:");
  forward_rejects([&](auto& a, auto& o) { a.cu_seqlens = offsets.view(); }, "q: expected rank 3");
  EXPECT_EQ(linear_attention_forward(c_.forward_args(), [&] {
              LinearAttentionOptions o = c_.options(Backend::cpu);
              o.backend = Backend::cuda;
              return o;
            }()).code(),
            StatusCode::invalid_argument);  // host memory, a GPU backend
}

TEST_F(LinearBadInput, Varlen) {
  LinearSpec s;
  s.varlen = true;
  s.lengths = {4, 6};
  s.trailing_rows = 1;
  s.layout = MemoryLayout{};
  LinearCase v(s, rng_.engine());
  auto rejects = [&](std::vector<std::int32_t> offsets, const std::string& prefix, DType dtype = DType::i32) {
    HostTensor cu = HostTensor::from_i32(offsets, {static_cast<std::int64_t>(offsets.size())});
    LinearForwardArgs a = v.forward_args();
    a.cu_seqlens = cu.view();
    a.cu_seqlens.dtype = dtype;
    const Status status = linear_attention_forward(a, v.options(Backend::cpu));
    EXPECT_EQ(status.code(), StatusCode::invalid_argument);
    EXPECT_EQ(status.message().rfind(prefix, 0), 0u) << status.message();
    EXPECT_EQ(v.out.count_nan(), v.out.numel());
  };
  rejects({1, 4, 10}, "cu_seqlens: expected cu_seqlens[0] == 0");
  rejects({0, 6, 4}, "cu_seqlens: must be non-decreasing");
  rejects({0, 4, 12}, "cu_seqlens: cu_seqlens[2] = 12 exceeds the 11 packed rows of q");
  rejects({0, 4, 10}, "cu_seqlens: expected dtype i32", DType::f32);
  rejects({}, "cu_seqlens: expected at least 1 entry");
}

TEST_F(LinearBadInput, Backward) {
  backward_rejects([](auto& a, auto&) { a.dout = {}; }, "dout: required");
  backward_rejects([](auto& a, auto&) { a.dout.shape[3] = 16; }, "dout: expected shape [2, 10, 4, 24]");
  backward_rejects([](auto& a, auto&) { a.dq.shape[2] = 2; }, "dq: expected shape");
  backward_rejects([](auto& a, auto&) { a.dk.dtype = DType::bf16; }, "dk: expected dtype f32");
  backward_rejects([](auto& a, auto&) { a.dv = {}; }, "dv: required");
  backward_rejects([](auto& a, auto&) { a.dk = a.k; }, "dk: overlaps k");
  backward_rejects([](auto& a, auto&) { a.initial_state = {}; }, "dinitial_state: the gradient of initial_state");
  backward_rejects([](auto& a, auto&) { a.initial_key_sum = {}; }, "dinitial_key_sum: the gradient of initial_key_sum");
  backward_rejects([](auto& a, auto& o) { o.normalize = false; a.initial_key_sum = {}; a.dinitial_key_sum = {}; },
                   "dfinal_key_sum: given without normalize");
  backward_rejects([](auto& a, auto&) { a.dfinal_state.shape[1] = 1; }, "dfinal_state: dim 1 (heads_kv)");
  backward_rejects([](auto& a, auto&) { a.dinitial_state = a.dfinal_state; }, "dinitial_state: overlaps dfinal_state");
}

TEST_F(LinearBadInput, Step) {
  HostTensor q(DType::f32, {2, 1, 4, 16}), k(DType::f32, {2, 1, 2, 16}), v(DType::f32, {2, 1, 2, 24});
  HostTensor out(DType::f32, {2, 1, 4, 24});
  HostTensor state(DType::f32, {2, 2, 16, 24}), key_sum(DType::f32, {2, 2, 16});
  HostTensor q2(DType::f32, {2, 2, 4, 16});
  out.poison();
  auto rejects = [&](const std::function<void(LinearStepArgs&, LinearAttentionOptions&)>& breaking,
                     const std::string& prefix) {
    LinearStepArgs a;
    a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view();
    a.state = state.view(), a.key_sum = key_sum.view();
    LinearAttentionOptions o;
    o.normalize = true;
    o.backend = Backend::cpu;
    breaking(a, o);
    const Status status = linear_attention_step(a, o);
    EXPECT_EQ(status.code(), StatusCode::invalid_argument);
    EXPECT_EQ(status.message().rfind(prefix, 0), 0u) << status.message();
    EXPECT_EQ(out.count_nan(), out.numel());
  };
  rejects([&](auto& a, auto&) { a.q = q2.view(); }, "q: dim 1 (tokens) must be 1");
  rejects([&](auto&, auto& o) { o.causal = false; }, "causal: the decode step is the causal recurrence");
  rejects([&](auto& a, auto&) { a.state = {}; }, "state: required");
  rejects([&](auto& a, auto&) { a.key_sum = {}; }, "key_sum: required");
  rejects([&](auto&, auto& o) { o.normalize = false; }, "key_sum: given without normalize");
  rejects([&](auto& a, auto&) { a.state_out = a.state; a.state_out.shape[0] = 1; }, "state_out: dim 0 (batch)");
  rejects([&](auto& a, auto&) { a.state_out = a.key_sum; }, "state_out: expected rank 4");
  rejects([&](auto& a, auto&) { a.key_sum_out = make_view(a.state.data, DType::f32, {2, 2, 16}); },
          "state_out: overlaps key_sum_out");
  // In place (state_out not given, or the very view of state) is fine.
  LinearStepArgs a;
  a.q = q.view(), a.k = k.view(), a.v = v.view(), a.out = out.view();
  a.state = state.view(), a.key_sum = key_sum.view();
  a.state_out = state.view();
  LinearAttentionOptions o;
  o.normalize = true;
  EXPECT_TRUE(linear_attention_step(a, o).ok());
}

// A backend without linear-attention kernels refuses by name (backend cudnn, for now).
TEST(LinearDispatch, BackendsWithoutKernelsRefuseByName) {
  struct NoLinearKernels final : detail::BackendImpl {
    Backend kind() const override { return Backend::cudnn; }
    bool available() const override { return true; }
    Status supports(const detail::Problem&) const override { return {}; }
    Status supports_merge(const detail::MergeProblem&) const override { return {}; }
    Status workspace_size(const detail::Problem&, std::size_t* bytes) const override {
      *bytes = 0;
      return {};
    }
    Status forward(const detail::Problem&, const RunContext&) override { return {}; }
    Status backward(const detail::Problem&, const RunContext&) override { return {}; }
    Status merge_states(const detail::MergeProblem&, const RunContext&) override { return {}; }
  } backend;
  detail::LinearProblem problem;
  for (const Status& status : {backend.supports_linear(problem), backend.linear_forward(problem, {}),
                               backend.linear_backward(problem, {})}) {
    EXPECT_EQ(status.code(), StatusCode::unsupported);
    EXPECT_EQ(status.message().rfind("linear attention: backend cudnn has no linear-attention kernels", 0), 0u)
        << status.message();
  }
}

}  // namespace
}  // namespace cuflash::test
