// Linear attention: a sibling op of softmax attention with its own entry
// points, the semantics of flash-linear-attention's chunk_linear_attn /
// fused_recurrent_linear_attn (docs/linear.md has every detail):
//
//   φq_t = scale · φ(q_t)        φk_s = φ(k_s)        (φ: the feature map, in fp32)
//   S_t  = S_0 + Σ_{s≤t} φk_s v_sᵀ     z_t = z_0 + Σ_{s≤t} φk_s     (causal)
//   o_t  = φq_tᵀ S_t                    (normalize: ÷ (φq_t · z_t + 1e-10))
//
// Non-causal: the sums run over the whole sequence. S_0 / z_0 are the optional
// initial state and key sum (0 when not given); the final ones, S_T and z_T,
// are optional outputs, so that a prefill chains into later calls and the
// decode step. State and accumulation are fp32 whatever the inputs' dtype.
//
// Shapes (last dimension contiguous, any other strides):
//   dense:   q [B, S, Hq, Dk]   k [B, S, Hk, Dk]   v [B, S, Hk, Dv]   out [B, S, Hq, Dv]
//   varlen:  q [T, Hq, Dk]      k [T, Hk, Dk]      v [T, Hk, Dv]      out [T, Hq, Dv]
//            with cu_seqlens int32 [B+1] (q, k and v share it)
//   state:   float32 [B, Hk, Dk, Dv]   key sum: float32 [B, Hk, Dk]
// Hq must be a multiple of Hk (GQA/MQA: query head h reads kv head h / (Hq / Hk)).
// The state belongs to a kv head: it is what flash-linear-attention holds in
// each query head of the group after repeating k and v. Every extent but Dk and
// Dv may be 0.
#pragma once

#include <optional>

#include "cuflash/options.hpp"
#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash {

// φ, applied elementwise to q and k in fp32.
enum class FeatureMap {
  identity,      // x
  elu_plus_one,  // elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise (flash-linear-attention's 'elu')
  relu,          // max(x, 0)
};

const char* feature_map_name(FeatureMap map);  // "identity", "elu+1", "relu"

// Added to the normalizer φq_t · z_t, as flash-linear-attention does: a row
// whose normalizer and numerator are both 0 (relu of a query with no positive
// entry) gets o_t = 0. Nothing else guards the division.
inline constexpr float kLinearNormalizerEps = 1e-10f;

struct LinearAttentionOptions {
  // Multiplies φ(q) (after the feature map). Defaults to 1/sqrt(Dk).
  std::optional<float> scale;
  bool causal = true;
  FeatureMap feature_map = FeatureMap::identity;
  bool normalize = false;
  // As AttentionOptions::check_index_contents: cu_seqlens on a GPU is copied
  // to the host to be checked unless this is off.
  bool check_index_contents = true;
  Backend backend = Backend::automatic;
};

struct LinearForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView cu_seqlens;       // given: varlen layout
  TensorView initial_state;    // optional f32 [B, Hk, Dk, Dv]
  TensorView initial_key_sum;  // optional f32 [B, Hk, Dk]; with normalize only
  TensorView final_state;      // optional output f32 [B, Hk, Dk, Dv]
  TensorView final_key_sum;    // optional output f32 [B, Hk, Dk]; with normalize only
};

// Everything is recomputed from q, k, v (and the initial state): the forward's
// out is not needed. dfinal_state / dfinal_key_sum are the gradients arriving
// at the forward's final_state / final_key_sum (0 when not given).
struct LinearBackwardArgs {
  TensorView q, k, v, dout;
  TensorView cu_seqlens;
  TensorView initial_state;     // as given to the forward
  TensorView initial_key_sum;
  TensorView dfinal_state;      // optional input f32 [B, Hk, Dk, Dv]
  TensorView dfinal_key_sum;    // optional input f32 [B, Hk, Dk]; with normalize only
  TensorView dq, dk, dv;        // like q, k, v
  TensorView dinitial_state;    // optional output, with initial_state only
  TensorView dinitial_key_sum;  // optional output, with initial_key_sum only
};

// One decode step of the causal recurrence: S' = S + φk vᵀ, z' = z + φk,
// out = φqᵀ S' (÷ (φq · z' + 1e-10) when normalize): the last row of the
// chunked forward over the tokens so far. options.causal must be true.
struct LinearStepArgs {
  TensorView q;        // [B, 1, Hq, Dk]
  TensorView k;        // [B, 1, Hk, Dk]
  TensorView v;        // [B, 1, Hk, Dv]
  TensorView out;      // [B, 1, Hq, Dv]
  TensorView state;    // f32 [B, Hk, Dk, Dv], read
  TensorView key_sum;  // f32 [B, Hk, Dk], read; required with normalize, refused without
  // Where S' and z' go; not given: into state and key_sum, in place. Either
  // exactly the input's view or memory that does not overlap any input.
  TensorView state_out;
  TensorView key_sum_out;
};

Status linear_attention_forward(const LinearForwardArgs& args, const LinearAttentionOptions& options = {},
                                const RunContext& context = {});
Status linear_attention_backward(const LinearBackwardArgs& args, const LinearAttentionOptions& options = {},
                                 const RunContext& context = {});
Status linear_attention_step(const LinearStepArgs& args, const LinearAttentionOptions& options = {},
                             const RunContext& context = {});

}  // namespace cuflash
