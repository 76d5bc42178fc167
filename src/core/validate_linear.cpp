// Validation of the linear-attention calls (include/cuflash/linear_attention.hpp),
// with the discipline of validate.cpp: every check of the op lives here, a
// failure names the argument, what was expected and what was given, and
// nothing has been written.
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "index_copy.hpp"
#include "tensor_checks.hpp"
#include "validate.hpp"

namespace cuflash::detail {

namespace {

std::string str(std::int64_t value) { return std::to_string(value); }


constexpr const char* kState = "[batch, heads_kv, key_dim, value_dim]";
constexpr const char* kKeySum = "[batch, heads_kv, key_dim]";

// The dimension names of q, k, v and out (dout, dq, ...) in messages.
struct Docs {
  const char* q;
  const char* k;
  const char* v;
  const char* out;
};

Docs docs_for(LinearPass pass, bool varlen) {
  if (pass == LinearPass::step)
    return {"[batch, 1, heads_q, key_dim]", "[batch, 1, heads_kv, key_dim]", "[batch, 1, heads_kv, value_dim]",
            "[batch, 1, heads_q, value_dim]"};
  if (varlen)
    return {"[total, heads_q, key_dim]", "[total, heads_kv, key_dim]", "[total, heads_kv, value_dim]",
            "[total, heads_q, value_dim]"};
  return {"[batch, seqlen, heads_q, key_dim]", "[batch, seqlen, heads_kv, key_dim]",
          "[batch, seqlen, heads_kv, value_dim]", "[batch, seqlen, heads_q, value_dim]"};
}

// q, k, v: presence, layout, dtype, device and how their shapes agree; fills the geometry.
Status check_inputs(const TensorView& q, const TensorView& k, const TensorView& v, const Docs& docs, LinearProblem* p) {
  const int rank = p->varlen ? 3 : 4;
  CUFLASH_TRY(check_query_key_value(q, k, v, rank, {docs.q, docs.k, docs.v}, "key_dim"));
  const int head_axis = rank - 2;
  const int dim_axis = rank - 1;
  // Every row of q has its key and value: the rows (and batch) dims agree.
  for (int d = 0; d < head_axis; ++d)
    if (k.shape[d] != q.shape[d])
      return Status::invalid("k: dim " + str(d) + " expected " + str(q.shape[d]) + " (like q: one key per query row), got " +
                             str(k.shape[d]) + " in shape " + shape_string(k));
  for (int d = 0; d < dim_axis; ++d)
    if (v.shape[d] != k.shape[d])
      return Status::invalid("v: dim " + str(d) + " expected " + str(k.shape[d]) + " (like k), got " + str(v.shape[d]) +
                             " in shape " + shape_string(v));
  CUFLASH_TRY(check_head_dim(v, "v", docs.v));

  p->dtype = q.dtype;
  p->device = q.device;
  p->heads_q = static_cast<int>(q.shape[head_axis]);
  p->heads_kv = static_cast<int>(k.shape[head_axis]);
  p->key_dim = static_cast<int>(q.shape[dim_axis]);
  p->value_dim = static_cast<int>(v.shape[dim_axis]);
  if (!p->varlen) {
    p->batch = static_cast<int>(q.shape[0]);
    p->max_len = static_cast<int>(q.shape[1]);
  }
  p->q = q;
  p->k = k;
  p->v = v;
  return {};
}

// out, dout: q's shape with v's value_dim.
Status check_out_like(const TensorView& view, const char* name, const LinearProblem& p, const char* doc) {
  TensorView expected = p.q;
  expected.shape[expected.rank - 1] = p.value_dim;
  return check_like(view, name, expected, "q, with v's value_dim", doc);
}

Status check_cu_seqlens(const TensorView& cu_seqlens, const LinearAttentionOptions& options, void* stream,
                        LinearProblem* p) {
  CUFLASH_TRY(check_layout(cu_seqlens, "cu_seqlens", 1, "[batch + 1]", true));
  CUFLASH_TRY(check_dtype(cu_seqlens, "cu_seqlens", DType::i32, "index tensors are int32"));
  CUFLASH_TRY(check_device(cu_seqlens, "cu_seqlens", p->device));
  const std::int64_t entries = cu_seqlens.shape[0];
  if (entries < 1) return Status::invalid("cu_seqlens: expected at least 1 entry [batch + 1], got " + str(entries));
  p->batch = static_cast<int>(entries - 1);
  p->cu_seqlens = cu_seqlens;
  if (p->device.kind == DeviceKind::cuda && !options.check_index_contents) return {};

  std::vector<std::int32_t>& offsets = p->host_cu_seqlens;
  CUFLASH_TRY(copy_index_tensor(cu_seqlens, "cu_seqlens", stream, &offsets));
  if (offsets[0] != 0) return Status::invalid("cu_seqlens: expected cu_seqlens[0] == 0, got " + str(offsets[0]));
  int longest = 0;
  for (std::size_t b = 1; b < offsets.size(); ++b) {
    if (offsets[b] < offsets[b - 1])
      return Status::invalid("cu_seqlens: must be non-decreasing, but cu_seqlens[" + str(b) + "] = " + str(offsets[b]) +
                             " < cu_seqlens[" + str(b - 1) + "] = " + str(offsets[b - 1]));
    longest = std::max(longest, offsets[b] - offsets[b - 1]);
  }
  if (offsets.back() > p->q.shape[0])
    return Status::invalid("cu_seqlens: cu_seqlens[" + str(entries - 1) + "] = " + str(offsets.back()) +
                           " exceeds the " + str(p->q.shape[0]) + " packed rows of q");
  p->max_len = longest;
  p->host_indices_valid = true;
  return {};
}

// A state [B, Hk, Dk, Dv] or a key sum [B, Hk, Dk], always float32.
Status check_state(const TensorView& view, const char* name, bool key_sum, const LinearProblem& p) {
  CUFLASH_TRY(check_layout(view, name, key_sum ? 3 : 4, key_sum ? kKeySum : kState, true));
  CUFLASH_TRY(check_dtype(view, name, DType::f32, "the state is float32"));
  CUFLASH_TRY(check_device(view, name, p.device));
  if (key_sum)
    return check_dims(view, name, {{"batch", p.batch}, {"heads_kv", p.heads_kv}, {"key_dim", p.key_dim}}, "from q and k");
  return check_dims(view, name,
                    {{"batch", p.batch}, {"heads_kv", p.heads_kv}, {"key_dim", p.key_dim}, {"value_dim", p.value_dim}},
                    "from q, k and v");
}

// An optional state-shaped tensor. Key sums exist only with normalize.
Status check_optional_state(const TensorView& view, const char* name, bool key_sum, bool output, const LinearProblem& p) {
  if (view.empty()) return {};
  if (key_sum && !p.normalize)
    return Status::invalid(std::string(name) +
                           ": given without normalize; the key sum z is the normalizer's state and exists only with "
                           "normalize = true");
  CUFLASH_TRY(check_state(view, name, key_sum, p));
  if (output) CUFLASH_TRY(check_no_self_overlap(view, name));
  return {};
}

Status resolve_options(const LinearAttentionOptions& options, LinearProblem* p) {
  if (options.scale && !std::isfinite(*options.scale))
    return Status::invalid("scale: expected a finite number, got " + std::to_string(*options.scale));
  switch (options.feature_map) {
    case FeatureMap::identity:
    case FeatureMap::elu_plus_one:
    case FeatureMap::relu: break;
    default:
      return Status::invalid("feature_map: expected identity, elu+1 or relu, got code " +
                             str(static_cast<int>(options.feature_map)));
  }
  p->scale = options.scale ? *options.scale : 1.0f / std::sqrt(static_cast<float>(p->key_dim));
  p->causal = options.causal;
  p->feature_map = options.feature_map;
  p->normalize = options.normalize;
  return {};
}

// Layout, q/k/v, cu_seqlens and options: what a forward and a backward share.
Status check_common(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                    const LinearAttentionOptions& options, void* stream, LinearProblem* p) {
  p->varlen = !cu_seqlens.empty();
  CUFLASH_TRY(check_inputs(q, k, v, docs_for(p->pass, p->varlen), p));
  if (p->varlen) CUFLASH_TRY(check_cu_seqlens(cu_seqlens, options, stream, p));
  return resolve_options(options, p);
}

}  // namespace

Status validate_linear_forward(const LinearForwardArgs& args, const LinearAttentionOptions& options, void* stream,
                               LinearProblem* problem) {
  LinearProblem p;
  p.pass = LinearPass::forward;
  CUFLASH_TRY(check_common(args.q, args.k, args.v, args.cu_seqlens, options, stream, &p));
  const Docs docs = docs_for(p.pass, p.varlen);
  CUFLASH_TRY(check_out_like(args.out, "out", p, docs.out));
  CUFLASH_TRY(check_no_self_overlap(args.out, "out"));
  CUFLASH_TRY(check_optional_state(args.initial_state, "initial_state", false, false, p));
  CUFLASH_TRY(check_optional_state(args.initial_key_sum, "initial_key_sum", true, false, p));
  CUFLASH_TRY(check_optional_state(args.final_state, "final_state", false, true, p));
  CUFLASH_TRY(check_optional_state(args.final_key_sum, "final_key_sum", true, true, p));
  p.out = args.out;
  p.initial_state = args.initial_state;
  p.initial_key_sum = args.initial_key_sum;
  p.final_state = args.final_state;
  p.final_key_sum = args.final_key_sum;
  CUFLASH_TRY(check_no_aliasing({{"out", p.out}, {"final_state", p.final_state}, {"final_key_sum", p.final_key_sum}},
                                {{"q", p.q},
                                 {"k", p.k},
                                 {"v", p.v},
                                 {"cu_seqlens", p.cu_seqlens},
                                 {"initial_state", p.initial_state},
                                 {"initial_key_sum", p.initial_key_sum}}));
  *problem = std::move(p);
  return {};
}

Status validate_linear_backward(const LinearBackwardArgs& args, const LinearAttentionOptions& options, void* stream,
                                LinearProblem* problem) {
  LinearProblem p;
  p.pass = LinearPass::backward;
  CUFLASH_TRY(check_common(args.q, args.k, args.v, args.cu_seqlens, options, stream, &p));
  const Docs docs = docs_for(p.pass, p.varlen);
  CUFLASH_TRY(check_out_like(args.dout, "dout", p, docs.out));
  CUFLASH_TRY(check_like(args.dq, "dq", p.q, "q", docs.q));
  CUFLASH_TRY(check_like(args.dk, "dk", p.k, "k", docs.k));
  CUFLASH_TRY(check_like(args.dv, "dv", p.v, "v", docs.v));
  for (const auto& [name, view] : {std::pair{"dq", args.dq}, std::pair{"dk", args.dk}, std::pair{"dv", args.dv}})
    CUFLASH_TRY(check_no_self_overlap(view, name));
  CUFLASH_TRY(check_optional_state(args.initial_state, "initial_state", false, false, p));
  CUFLASH_TRY(check_optional_state(args.initial_key_sum, "initial_key_sum", true, false, p));
  CUFLASH_TRY(check_optional_state(args.dfinal_state, "dfinal_state", false, false, p));
  CUFLASH_TRY(check_optional_state(args.dfinal_key_sum, "dfinal_key_sum", true, false, p));
  if (!args.dinitial_state.empty() && args.initial_state.empty())
    return Status::invalid("dinitial_state: the gradient of initial_state, given without initial_state (pass the "
                           "forward's initial_state too)");
  if (!args.dinitial_key_sum.empty() && args.initial_key_sum.empty())
    return Status::invalid("dinitial_key_sum: the gradient of initial_key_sum, given without initial_key_sum (pass "
                           "the forward's initial_key_sum too)");
  CUFLASH_TRY(check_optional_state(args.dinitial_state, "dinitial_state", false, true, p));
  CUFLASH_TRY(check_optional_state(args.dinitial_key_sum, "dinitial_key_sum", true, true, p));
  p.dout = args.dout;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;
  p.initial_state = args.initial_state;
  p.initial_key_sum = args.initial_key_sum;
  p.dfinal_state = args.dfinal_state;
  p.dfinal_key_sum = args.dfinal_key_sum;
  p.dinitial_state = args.dinitial_state;
  p.dinitial_key_sum = args.dinitial_key_sum;
  CUFLASH_TRY(check_no_aliasing({{"dq", p.dq},
                                 {"dk", p.dk},
                                 {"dv", p.dv},
                                 {"dinitial_state", p.dinitial_state},
                                 {"dinitial_key_sum", p.dinitial_key_sum}},
                                {{"q", p.q},
                                 {"k", p.k},
                                 {"v", p.v},
                                 {"dout", p.dout},
                                 {"cu_seqlens", p.cu_seqlens},
                                 {"initial_state", p.initial_state},
                                 {"initial_key_sum", p.initial_key_sum},
                                 {"dfinal_state", p.dfinal_state},
                                 {"dfinal_key_sum", p.dfinal_key_sum}}));
  *problem = std::move(p);
  return {};
}

Status validate_linear_step(const LinearStepArgs& args, const LinearAttentionOptions& options, LinearProblem* problem) {
  LinearProblem p;
  p.pass = LinearPass::step;
  p.varlen = false;
  const Docs docs = docs_for(p.pass, false);
  // Before check_inputs, which would measure k against a q of the wrong length.
  if (args.q.rank == 4 && args.q.shape[1] != 1)
    return Status::invalid("q: dim 1 (tokens) must be 1 in a decode step (one token per sequence; longer chunks go "
                           "through linear_attention_forward with initial_state), got shape " +
                           shape_string(args.q));
  CUFLASH_TRY(check_inputs(args.q, args.k, args.v, docs, &p));
  CUFLASH_TRY(resolve_options(options, &p));
  if (!p.causal)
    return Status::invalid("causal: the decode step is the causal recurrence; options.causal must be true");
  CUFLASH_TRY(check_out_like(args.out, "out", p, docs.out));
  CUFLASH_TRY(check_no_self_overlap(args.out, "out"));
  CUFLASH_TRY(check_given(args.state, "state"));
  CUFLASH_TRY(check_optional_state(args.state, "state", false, false, p));
  if (p.normalize) CUFLASH_TRY(check_given(args.key_sum, "key_sum"));
  CUFLASH_TRY(check_optional_state(args.key_sum, "key_sum", true, false, p));
  CUFLASH_TRY(check_optional_state(args.state_out, "state_out", false, true, p));
  CUFLASH_TRY(check_optional_state(args.key_sum_out, "key_sum_out", true, true, p));
  const TensorView state_out = args.state_out.empty() ? args.state : args.state_out;
  const TensorView key_sum_out = args.key_sum_out.empty() ? args.key_sum : args.key_sum_out;
  // In place is allowed: each (sequence, kv head) state is read whole before it is written.
  std::vector<NamedView> inputs = {{"q", args.q}, {"k", args.k}, {"v", args.v}};
  if (!same_view(state_out, args.state)) inputs.push_back({"state", args.state});
  if (!same_view(key_sum_out, args.key_sum)) inputs.push_back({"key_sum", args.key_sum});
  CUFLASH_TRY(check_no_aliasing(
      {{"out", args.out}, {"state_out", state_out}, {"key_sum_out", key_sum_out}}, inputs));
  p.out = args.out;
  p.initial_state = args.state;
  p.initial_key_sum = args.key_sum;
  p.final_state = state_out;
  p.final_key_sum = key_sum_out;
  *problem = std::move(p);
  return {};
}

}  // namespace cuflash::detail
