// Backend cpu's rotary embedding of a KV-cache forward (the rule is
// src/core/rotary.hpp): a row of q or k_new, loaded as floats, rotated in
// place at its position and rounded once to its tensor's dtype, which is what
// the call attends to (q) and what the append writes into the cache (k).
#pragma once

#include "problem.hpp"
#include "rotary.hpp"
#include "tensor_access.hpp"

namespace cuflash::detail::cpu {

class RotaryRows {
 public:
  explicit RotaryRows(const Problem& problem) : problem_(problem) {}

  bool enabled() const { return problem_.rotary_dim > 0; }
  // Floats of scratch that rotate() needs: one position's cos and sin.
  int scratch_floats() const { return problem_.rotary_dim; }

  // Query row i of sequence b (head_dim floats of q).
  void rotate_query(float* row, int b, int i, float* scratch) const {
    rotate(row, rotary_query_position(problem_.host_seqlens_k[b], i, problem_.rotary_positional_queries()),
           scratch);
  }
  // Appended row n of sequence b (head_dim floats of k_new).
  void rotate_appended_key(float* row, int b, int n, float* scratch) const {
    rotate(row, rotary_key_position(problem_.host_seqlens_k[b], n), scratch);
  }

 private:
  void rotate(float* row, int position, float* scratch) const {
    const int rotary_dim = problem_.rotary_dim;
    const int pairs = rotary_dim / 2;
    float* cos = scratch;
    float* sin = scratch + pairs;
    load_row(problem_.rotary_cos, position * problem_.rotary_cos.strides[0], pairs, cos);
    load_row(problem_.rotary_sin, position * problem_.rotary_sin.strides[0], pairs, sin);
    // q, k_new and the cache share q's dtype (validated).
    const DType dtype = problem_.dtype;
    for (int k = 0; k < pairs; ++k) {
      const RotaryPair pair = rotary_pair(k, rotary_dim, problem_.rotary_interleaved);
      const float first = row[pair.first];
      const float second = row[pair.second];
      row[pair.first] = round_to(dtype, rotate_value(first, second, cos[k], sin[k], true));
      row[pair.second] = round_to(dtype, rotate_value(second, first, cos[k], sin[k], false));
    }
  }

  const Problem& problem_;
};

}  // namespace cuflash::detail::cpu
