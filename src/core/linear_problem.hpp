// LinearProblem: one validated linear-attention call (forward, backward or
// decode step), normalized for the backends. Built only by validate_linear_*().
#pragma once

#include <cstdint>
#include <vector>

#include "cuflash/linear_attention.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash::detail {

enum class LinearPass {
  forward,
  backward,
  // The decode step: a dense causal forward of one token per sequence, whose
  // initial_state / final_state are the step's state / state_out (and the key
  // sums likewise). The outputs may be exactly the inputs' views (in place).
  step,
};

struct LinearProblem {
  LinearPass pass = LinearPass::forward;
  bool varlen = false;
  DType dtype = DType::f32;  // of q, k, v, out (and dout, dq, dk, dv)
  Device device{};

  int batch = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int key_dim = 0;    // Dk, of q and k
  int value_dim = 0;  // Dv, of v and out
  int max_len = 0;    // dense: S; varlen: the longest sequence (host_indices_valid) or 0

  // Resolved options.
  float scale = 0.0f;  // multiplies φ(q)
  bool causal = true;
  FeatureMap feature_map = FeatureMap::identity;
  bool normalize = false;

  // The caller's views, checked. Unused ones are empty.
  TensorView q, k, v, out;
  TensorView initial_state, initial_key_sum;    // inputs (step: state, key_sum)
  TensorView final_state, final_key_sum;        // forward outputs (step: state_out, key_sum_out)
  TensorView dout, dq, dk, dv;                  // backward
  TensorView dfinal_state, dfinal_key_sum;      // backward inputs
  TensorView dinitial_state, dinitial_key_sum;  // backward outputs
  TensorView cu_seqlens;

  std::vector<std::int32_t> host_cu_seqlens;  // varlen, when readable on the host
  bool host_indices_valid = false;

  int group_size() const { return heads_q / heads_kv; }
  // Rows of sequence b and where the first one lives (dense: row 0 of batch entry b;
  // varlen: packed row cu_seqlens[b]). Varlen needs host_indices_valid.
  int seq_len(int b) const { return varlen ? host_cu_seqlens[b + 1] - host_cu_seqlens[b] : max_len; }
  std::int64_t first_row(int b) const { return varlen ? host_cu_seqlens[b] : 0; }
  // Rows of q as the kernels index them (varlen: the packed rows, trailing ones included).
  std::int64_t packed_rows() const { return varlen ? q.shape[0] : static_cast<std::int64_t>(batch) * max_len; }
};

}  // namespace cuflash::detail
