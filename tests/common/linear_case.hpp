// One linear-attention call's tensors for the tests of every backend: the
// spec (dtype, feature map, lengths, heads, dims, state, memory layout) and
// its host tensors, inputs random and outputs poisoned with NaN, with the
// options and argument views the entry points and the float64 oracle take.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"

namespace cuflash::test {

struct LinearSpec {
  DType dtype = DType::f32;
  FeatureMap map = FeatureMap::identity;
  bool normalize = false;
  bool causal = true;
  bool varlen = false;
  std::vector<int> lengths = {70, 70};  // dense: all equal (batch = lengths.size())
  int trailing_rows = 0;                 // varlen: packed rows after the last sequence
  int heads_q = 4, heads_kv = 2, key_dim = 16, value_dim = 24;
  bool with_state = false;  // initial state (and key sum), final outputs, their gradients
  // Memory of q, k, v and their gradients; unset: dense [B, H, S, D] strides,
  // varlen padded rows (MemoryLayout{} for contiguous views).
  std::optional<MemoryLayout> layout;
  std::optional<float> scale;
};

// Every tensor of a forward and a backward call, random inputs and poisoned outputs.
struct LinearCase {
  LinearSpec spec;
  int batch = 0;
  std::int64_t rows = 0;  // dense: seqlen; varlen: packed rows
  HostTensor q, k, v, out, cu_seqlens, initial_state, initial_key_sum, final_state, final_key_sum;
  HostTensor dout, dq, dk, dv, dfinal_state, dfinal_key_sum, dinitial_state, dinitial_key_sum;

  LinearCase(LinearSpec s, std::mt19937& engine) : spec(std::move(s)) {
    batch = static_cast<int>(spec.lengths.size());
    const MemoryLayout layout = spec.layout ? *spec.layout : spec.varlen ? MemoryLayout::padded(3) : MemoryLayout::bhsd();
    std::vector<std::int64_t> outer;
    if (spec.varlen) {
      std::vector<std::int32_t> offsets = {0};
      for (int length : spec.lengths) offsets.push_back(offsets.back() + length);
      rows = offsets.back() + spec.trailing_rows;
      cu_seqlens = HostTensor::from_i32(offsets, {static_cast<std::int64_t>(offsets.size())});
      outer = {rows};
    } else {
      rows = spec.lengths.empty() ? 0 : spec.lengths[0];
      outer = {batch, rows};
    }
    auto shape = [&](int heads, int dim) {
      std::vector<std::int64_t> s = outer;
      s.push_back(heads);
      s.push_back(dim);
      return s;
    };
    q = HostTensor(spec.dtype, shape(spec.heads_q, spec.key_dim), layout);
    k = HostTensor(spec.dtype, shape(spec.heads_kv, spec.key_dim), layout);
    v = HostTensor(spec.dtype, shape(spec.heads_kv, spec.value_dim), layout);
    out = HostTensor(spec.dtype, shape(spec.heads_q, spec.value_dim), layout);
    dout = HostTensor(spec.dtype, shape(spec.heads_q, spec.value_dim), layout);
    dq = HostTensor(spec.dtype, shape(spec.heads_q, spec.key_dim), layout);
    dk = HostTensor(spec.dtype, shape(spec.heads_kv, spec.key_dim), layout);
    dv = HostTensor(spec.dtype, shape(spec.heads_kv, spec.value_dim), layout);
    // The normalizer φq·z is ill-conditioned near 0: with identity features it
    // has no sign of its own, and with relu a query and a key sum that share
    // one small positive feature make it tiny (an f32 dk off by 2e-4 of its
    // scale, seed 21243023, about once in 40 runs of the matrix). Positive
    // means keep it away from 0; relu still meets negative inputs (2 % of
    // them) and the all-negative query has a test of its own (HandWorkedValues).
    const double mean =
        spec.normalize && (spec.map == FeatureMap::identity || spec.map == FeatureMap::relu) ? 1.0 : 0.0;
    const double stddev = mean > 0.0 ? 0.5 : 1.0;
    q.fill_normal(engine, stddev, mean);
    k.fill_normal(engine, stddev, mean);
    v.fill_normal(engine);
    dout.fill_normal(engine);
    const std::vector<std::int64_t> state_shape = {batch, spec.heads_kv, spec.key_dim, spec.value_dim};
    const std::vector<std::int64_t> key_sum_shape = {batch, spec.heads_kv, spec.key_dim};
    if (spec.with_state) {
      initial_state = HostTensor(DType::f32, state_shape);
      final_state = HostTensor(DType::f32, state_shape);
      dfinal_state = HostTensor(DType::f32, state_shape);
      dinitial_state = HostTensor(DType::f32, state_shape);
      initial_state.fill_normal(engine);
      dfinal_state.fill_normal(engine);
      if (spec.normalize) {
        initial_key_sum = HostTensor(DType::f32, key_sum_shape);
        final_key_sum = HostTensor(DType::f32, key_sum_shape);
        dfinal_key_sum = HostTensor(DType::f32, key_sum_shape);
        dinitial_key_sum = HostTensor(DType::f32, key_sum_shape);
        initial_key_sum.fill_normal(engine, 0.5, 2.0);  // a sum of features: positive
        dfinal_key_sum.fill_normal(engine);
      }
    }
    for (HostTensor* t : {&out, &final_state, &final_key_sum, &dq, &dk, &dv, &dinitial_state, &dinitial_key_sum})
      if (!t->empty()) t->poison();
  }

  LinearAttentionOptions options(Backend backend) const {
    LinearAttentionOptions o;
    o.causal = spec.causal;
    o.feature_map = spec.map;
    o.normalize = spec.normalize;
    o.scale = spec.scale;
    o.backend = backend;
    return o;
  }

  LinearForwardArgs forward_args() const {
    LinearForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.cu_seqlens = cu_seqlens.view();
    a.initial_state = initial_state.view();
    a.initial_key_sum = initial_key_sum.view();
    a.final_state = final_state.view();
    a.final_key_sum = final_key_sum.view();
    return a;
  }

  LinearBackwardArgs backward_args() const {
    LinearBackwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.dout = dout.view();
    a.cu_seqlens = cu_seqlens.view();
    a.initial_state = initial_state.view();
    a.initial_key_sum = initial_key_sum.view();
    a.dfinal_state = dfinal_state.view();
    a.dfinal_key_sum = dfinal_key_sum.view();
    a.dq = dq.view();
    a.dk = dk.view();
    a.dv = dv.view();
    a.dinitial_state = dinitial_state.view();
    a.dinitial_key_sum = dinitial_key_sum.view();
    return a;
  }
};

// A test name's word for a feature map.
inline std::string map_label(FeatureMap map) {
  switch (map) {
    case FeatureMap::identity: return "identity";
    case FeatureMap::elu_plus_one: return "elu1";
    case FeatureMap::relu: return "relu";
  }
  return "unknown";
}

// The parameters of the backends' test matrices: map, normalize, causal, varlen, dtype.
using LinearMatrixParam = std::tuple<FeatureMap, bool, bool, bool, DType>;

// Which dense length and whether the states take part, spread over a matrix so
// that every length meets both (2 and 5 are coprime).
inline int matrix_index(const LinearMatrixParam& param) {
  const auto& [map, normalize, causal, varlen, dtype] = param;
  return ((static_cast<int>(map) * 2 + normalize) * 2 + causal) * 3 + static_cast<int>(dtype);
}

// The checks of both backends' linear tests against a reference.
// `scale`: the size of the quantities `got` is computed from. A gradient that is
// nearly 0 by cancellation (a normalized row is a weighted average, so its q
// and k gradients vanish where every weight falls on one value) is held to an
// error that small against its neighbours' size instead of its own.
// exact_zeros: a 0 of the reference must be matched exactly (the float64
// oracle's zeros are structural); not against another computation (the fp32
// CPU reference, the chaining tests), where a sum can round to 0 in one order
// and not in another (a relu dq of 0 in one call, 3e-8 in two halves).
inline void expect_close(const HostTensor& got, const std::vector<double>& ref, double tol, const std::string& what,
                         double scale = 0.0, bool exact_zeros = true) {
  const ErrorStats st = compare_zeros_where(got, ref, std::vector<bool>(ref.size(), exact_zeros));
  if (st.mismatches == 0 && st.max_abs <= tol * scale) return;
  EXPECT_LE(st.rel_l2, tol) << what << ": " << st.describe();
  EXPECT_LE(st.max_abs, 10 * tol * std::max(1.0, st.ref_max_abs)) << what << ": " << st.describe();
}

// The largest finite |value|.
inline double max_abs(const std::vector<double>& values) {
  double largest = 0.0;
  for (double x : values)
    if (std::isfinite(x)) largest = std::max(largest, std::abs(x));
  return largest;
}

}  // namespace cuflash::test
