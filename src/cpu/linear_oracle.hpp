// The float64 oracle of linear attention: every output row summed pair by
// pair over the keys it sees, in double, sharing no code with the backend
// (no chunks, no carried state). Same semantics as the API (docs/linear.md).
#pragma once

#include <vector>

#include "cuflash/linear_attention.hpp"

namespace cuflash::oracle {

struct LinearForwardResult {
  std::vector<double> out;            // out's logical shape, row-major; NaN on varlen rows of no sequence
  std::vector<double> final_state;    // [B, Hk, Dk, Dv], always computed
  std::vector<double> final_key_sum;  // [B, Hk, Dk], always computed (z_0 + Σ φ(k_s))
};

struct LinearBackwardResult {
  std::vector<double> dq, dk, dv;        // like q, k, v, row-major; 0 on varlen rows of no sequence
  std::vector<double> dinitial_state;    // [B, Hk, Dk, Dv], always computed
  std::vector<double> dinitial_key_sum;  // [B, Hk, Dk], always computed
};

// Host tensors of any supported dtype and strides, validated like the API
// (args.out, dq, dk, dv must be given as shape templates; nothing is written).
// The step's arguments are the forward's with one row: use the forward.
Status linear_forward_float64(const LinearForwardArgs& args, const LinearAttentionOptions& options,
                              LinearForwardResult* result);
// Analytic gradients of the forward's out (and final state / key sum, through
// args.dfinal_state / dfinal_key_sum), from q, k, v, dout and the initial state.
Status linear_backward_float64(const LinearBackwardArgs& args, const LinearAttentionOptions& options,
                               LinearBackwardResult* result);

}  // namespace cuflash::oracle
