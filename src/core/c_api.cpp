// The C ABI (include/cuflash/cuflash_c.h): plain structs turned into the C++
// API's views and options, a Status turned into a code plus a thread-local
// message. Nothing thrown inside crosses the extern "C" boundary.
#include "cuflash/cuflash_c.h"
#include "cuflash/ring.hpp"

#include <algorithm>
#include <exception>
#include <initializer_list>
#include <new>
#include <string>

#include "cuflash/cuflash.hpp"

namespace {

using namespace cuflash;

static_assert(static_cast<int>(StatusCode::ok) == CUFLASH_OK);
static_assert(static_cast<int>(StatusCode::invalid_argument) == CUFLASH_INVALID_ARGUMENT);
static_assert(static_cast<int>(StatusCode::unsupported) == CUFLASH_UNSUPPORTED);
static_assert(static_cast<int>(StatusCode::cuda_error) == CUFLASH_CUDA_ERROR);
static_assert(static_cast<int>(StatusCode::cudnn_error) == CUFLASH_CUDNN_ERROR);
static_assert(static_cast<int>(StatusCode::internal) == CUFLASH_INTERNAL);
static_assert(static_cast<int>(DType::f32) == CUFLASH_F32 && static_cast<int>(DType::f16) == CUFLASH_F16 &&
              static_cast<int>(DType::bf16) == CUFLASH_BF16 && static_cast<int>(DType::i32) == CUFLASH_I32);
static_assert(static_cast<int>(Backend::automatic) == CUFLASH_BACKEND_AUTO &&
              static_cast<int>(Backend::cpu) == CUFLASH_BACKEND_CPU &&
              static_cast<int>(Backend::cuda) == CUFLASH_BACKEND_CUDA &&
              static_cast<int>(Backend::cudnn) == CUFLASH_BACKEND_CUDNN);
static_assert(CUFLASH_MAX_RANK == kMaxRank);
static_assert(static_cast<int>(FeatureMap::identity) == CUFLASH_FEATURE_IDENTITY &&
              static_cast<int>(FeatureMap::elu_plus_one) == CUFLASH_FEATURE_ELU_PLUS_ONE &&
              static_cast<int>(FeatureMap::relu) == CUFLASH_FEATURE_RELU);

thread_local std::string last_error;

cuflash_status finish(const Status& status) {
  if (status.ok()) {
    last_error.clear();
    return CUFLASH_OK;
  }
  last_error = status.message();
  return static_cast<cuflash_status>(status.code());
}

// Runs `body` (which returns a Status), turning anything thrown into a status.
template <typename Body>
cuflash_status guarded(Body body) noexcept {
  try {
    return finish(body());
  } catch (const std::bad_alloc&) {
    last_error = "out of host memory";
  } catch (const std::exception& error) {
    last_error = std::string("unexpected exception: ") + error.what();
  } catch (...) {
    last_error = "unexpected exception";
  }
  return CUFLASH_INTERNAL;
}

// A C tensor as a TensorView; a bad enum or rank is reported by name.
Status to_view(const cuflash_tensor& tensor, const char* name, TensorView* view) {
  *view = TensorView{};
  if (tensor.rank == 0) return {};
  if (tensor.rank < 0 || tensor.rank > kMaxRank)
    return Status::invalid(std::string(name) + ": rank must be 0 (not given) to " + std::to_string(kMaxRank) +
                           ", got " + std::to_string(tensor.rank));
  if (tensor.dtype < CUFLASH_F32 || tensor.dtype > CUFLASH_I32)
    return Status::invalid(std::string(name) + ": unknown dtype code " + std::to_string(tensor.dtype));
  if (tensor.device_kind != CUFLASH_DEVICE_HOST && tensor.device_kind != CUFLASH_DEVICE_CUDA)
    return Status::invalid(std::string(name) + ": unknown device kind " + std::to_string(tensor.device_kind));
  if (tensor.device_index < 0)
    return Status::invalid(std::string(name) + ": device index must be >= 0, got " + std::to_string(tensor.device_index));
  view->data = tensor.data;
  view->dtype = static_cast<DType>(tensor.dtype);
  view->device = tensor.device_kind == CUFLASH_DEVICE_CUDA ? Device::cuda(tensor.device_index) : Device::host();
  view->rank = tensor.rank;
  std::copy_n(tensor.shape, tensor.rank, view->shape);
  std::copy_n(tensor.strides, tensor.rank, view->strides);
  return {};
}

// An optional pointer-to-tensor argument: NULL means not given.
Status to_view(const cuflash_tensor* tensor, const char* name, TensorView* view) {
  if (tensor == nullptr) {
    *view = TensorView{};
    return {};
  }
  return to_view(*tensor, name, view);
}

Status to_options(const cuflash_options* in, AttentionOptions* out) {
  *out = AttentionOptions{};
  if (in == nullptr) return {};
  if (in->backend < CUFLASH_BACKEND_AUTO || in->backend > CUFLASH_BACKEND_CUDNN)
    return Status::invalid("options.backend: unknown backend code " + std::to_string(in->backend));
  if (in->has_softmax_scale) out->softmax_scale = in->softmax_scale;
  out->causal = in->causal != 0;
  out->window_left = in->window_left;
  out->window_right = in->window_right;
  out->softcap = in->softcap;
  out->deterministic = in->deterministic != 0;
  out->check_index_contents = in->check_index_contents != 0;
  out->backend = static_cast<Backend>(in->backend);
  out->dropout_p = in->dropout_p;
  out->dropout_seed = in->dropout_seed;
  out->dropout_offset = in->dropout_offset;
  if (in->has_diagonal_offset) out->diagonal_offset = in->diagonal_offset;
  return {};
}

RunContext to_context(const cuflash_run_context* in) {
  RunContext context;
  if (in != nullptr) {
    context.stream = in->stream;
    context.workspace = in->workspace;
    context.workspace_bytes = in->workspace_bytes;
  }
  return context;
}

Status null_check(const void* pointer, const char* name) {
  if (pointer == nullptr) return Status::invalid(std::string(name) + ": NULL pointer");
  return {};
}

// The varlen and KV-cache index views, shared by the forward and backward
// argument structs (which name these fields alike).
template <typename Args>
Status to_batch_indices(const Args& in, VarlenBatch* varlen, KvCache* cache) {
  CUFLASH_TRY(to_view(in.cu_seqlens_q, "varlen.cu_seqlens_q", &varlen->cu_seqlens_q));
  CUFLASH_TRY(to_view(in.cu_seqlens_k, "varlen.cu_seqlens_k", &varlen->cu_seqlens_k));
  varlen->max_seqlen_q = in.max_seqlen_q;
  varlen->max_seqlen_k = in.max_seqlen_k;
  CUFLASH_TRY(to_view(in.seqlens_k, "kv_cache.seqlens_k", &cache->seqlens_k));
  CUFLASH_TRY(to_view(in.leftpad, "kv_cache.leftpad", &cache->leftpad));
  return to_view(in.block_table, "kv_cache.block_table", &cache->block_table);
}

Status to_forward(const cuflash_forward_args& in, ForwardArgs* out) {
  CUFLASH_TRY(to_view(in.q, "q", &out->q));
  CUFLASH_TRY(to_view(in.k, "k", &out->k));
  CUFLASH_TRY(to_view(in.v, "v", &out->v));
  CUFLASH_TRY(to_view(in.out, "out", &out->out));
  CUFLASH_TRY(to_view(in.lse, "lse", &out->lse));
  CUFLASH_TRY(to_view(in.alibi_slopes, "alibi_slopes", &out->alibi_slopes));
  CUFLASH_TRY(to_batch_indices(in, &out->varlen, &out->kv_cache));
  CUFLASH_TRY(to_view(in.k_new, "kv_cache.k_new", &out->kv_cache.k_new));
  CUFLASH_TRY(to_view(in.sinks, "sinks", &out->sinks));
  CUFLASH_TRY(to_view(in.attn_probs, "attn_probs", &out->attn_probs));
  CUFLASH_TRY(to_view(in.rotary_cos, "kv_cache.rotary_cos", &out->kv_cache.rotary_cos));
  CUFLASH_TRY(to_view(in.rotary_sin, "kv_cache.rotary_sin", &out->kv_cache.rotary_sin));
  out->kv_cache.rotary_interleaved = in.rotary_interleaved != 0;
  return to_view(in.v_new, "kv_cache.v_new", &out->kv_cache.v_new);
}

Status to_backward(const cuflash_backward_args& in, BackwardArgs* out) {
  CUFLASH_TRY(to_view(in.q, "q", &out->q));
  CUFLASH_TRY(to_view(in.k, "k", &out->k));
  CUFLASH_TRY(to_view(in.v, "v", &out->v));
  CUFLASH_TRY(to_view(in.out, "out", &out->out));
  CUFLASH_TRY(to_view(in.dout, "dout", &out->dout));
  CUFLASH_TRY(to_view(in.lse, "lse", &out->lse));
  CUFLASH_TRY(to_view(in.dq, "dq", &out->dq));
  CUFLASH_TRY(to_view(in.dk, "dk", &out->dk));
  CUFLASH_TRY(to_view(in.dv, "dv", &out->dv));
  CUFLASH_TRY(to_view(in.alibi_slopes, "alibi_slopes", &out->alibi_slopes));
  CUFLASH_TRY(to_view(in.sinks, "sinks", &out->sinks));
  CUFLASH_TRY(to_view(in.dsinks, "dsinks", &out->dsinks));
  return to_batch_indices(in, &out->varlen, &out->kv_cache);
}

Status to_linear_options(const cuflash_linear_options* in, LinearAttentionOptions* out) {
  *out = LinearAttentionOptions{};
  if (in == nullptr) return {};
  if (in->backend < CUFLASH_BACKEND_AUTO || in->backend > CUFLASH_BACKEND_CUDNN)
    return Status::invalid("options.backend: unknown backend code " + std::to_string(in->backend));
  if (in->feature_map < CUFLASH_FEATURE_IDENTITY || in->feature_map > CUFLASH_FEATURE_RELU)
    return Status::invalid("options.feature_map: unknown feature map code " + std::to_string(in->feature_map));
  if (in->has_scale) out->scale = in->scale;
  out->causal = in->causal != 0;
  out->feature_map = static_cast<FeatureMap>(in->feature_map);
  out->normalize = in->normalize != 0;
  out->check_index_contents = in->check_index_contents != 0;
  out->backend = static_cast<Backend>(in->backend);
  return {};
}

// Views of named struct fields: `fields` pairs each C tensor with its name and destination.
struct FieldView {
  const cuflash_tensor* tensor;
  const char* name;
  TensorView* view;
};

Status to_views(std::initializer_list<FieldView> fields) {
  for (const FieldView& field : fields) CUFLASH_TRY(to_view(*field.tensor, field.name, field.view));
  return {};
}

}  // namespace

extern "C" {

const char* cuflash_version(void) { return cuflash::version(); }

int cuflash_backend_available(int32_t backend) {
  if (backend < CUFLASH_BACKEND_AUTO || backend > CUFLASH_BACKEND_CUDNN) return 0;
  try {
    return cuflash::backend_available(static_cast<Backend>(backend)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

const char* cuflash_status_name(cuflash_status status) {
  if (status < CUFLASH_OK || status > CUFLASH_INTERNAL) return "unknown";
  return cuflash::status_code_name(static_cast<StatusCode>(status));
}

const char* cuflash_last_error_message(void) { return last_error.c_str(); }

void cuflash_options_init(cuflash_options* options) {
  if (options == nullptr) return;
  *options = cuflash_options{};
  options->window_left = -1;
  options->window_right = -1;
  options->check_index_contents = 1;
  options->backend = CUFLASH_BACKEND_AUTO;
}

cuflash_tensor cuflash_make_tensor(void* data, int32_t dtype, int32_t rank, const int64_t* shape, int32_t device_kind,
                                   int32_t device_index) {
  cuflash_tensor tensor{};
  tensor.data = data;
  tensor.dtype = dtype;
  tensor.device_kind = device_kind;
  tensor.device_index = device_index;
  if (rank < 0 || rank > CUFLASH_MAX_RANK || (rank > 0 && shape == nullptr)) {
    tensor.rank = -1;
    return tensor;
  }
  tensor.rank = rank;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    tensor.shape[d] = shape[d];
    tensor.strides[d] = stride;
    stride *= shape[d];
  }
  return tensor;
}

cuflash_status cuflash_attention_forward(const cuflash_forward_args* args, const cuflash_options* options,
                                         const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    ForwardArgs forward;
    AttentionOptions opts;
    CUFLASH_TRY(to_forward(*args, &forward));
    CUFLASH_TRY(to_options(options, &opts));
    return attention_forward(forward, opts, to_context(context));
  });
}

cuflash_status cuflash_attention_backward(const cuflash_backward_args* args, const cuflash_options* options,
                                          const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    BackwardArgs backward;
    AttentionOptions opts;
    CUFLASH_TRY(to_backward(*args, &backward));
    CUFLASH_TRY(to_options(options, &opts));
    return attention_backward(backward, opts, to_context(context));
  });
}

cuflash_status cuflash_attention_with_kvcache(const cuflash_tensor* q, const cuflash_tensor* k_cache,
                                              const cuflash_tensor* v_cache, const cuflash_tensor* k_new,
                                              const cuflash_tensor* v_new, const cuflash_tensor* seqlens_k,
                                              const cuflash_tensor* block_table, const cuflash_tensor* alibi_slopes,
                                              const cuflash_tensor* out, const cuflash_tensor* lse,
                                              const cuflash_options* options, const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(q, "q"));
    CUFLASH_TRY(null_check(k_cache, "k_cache"));
    CUFLASH_TRY(null_check(v_cache, "v_cache"));
    CUFLASH_TRY(null_check(seqlens_k, "seqlens_k"));
    CUFLASH_TRY(null_check(out, "out"));
    ForwardArgs forward;
    CUFLASH_TRY(to_view(q, "q", &forward.q));
    CUFLASH_TRY(to_view(k_cache, "k", &forward.k));
    CUFLASH_TRY(to_view(v_cache, "v", &forward.v));
    CUFLASH_TRY(to_view(out, "out", &forward.out));
    CUFLASH_TRY(to_view(lse, "lse", &forward.lse));
    CUFLASH_TRY(to_view(alibi_slopes, "alibi_slopes", &forward.alibi_slopes));
    CUFLASH_TRY(to_view(seqlens_k, "kv_cache.seqlens_k", &forward.kv_cache.seqlens_k));
    CUFLASH_TRY(to_view(block_table, "kv_cache.block_table", &forward.kv_cache.block_table));
    CUFLASH_TRY(to_view(k_new, "kv_cache.k_new", &forward.kv_cache.k_new));
    CUFLASH_TRY(to_view(v_new, "kv_cache.v_new", &forward.kv_cache.v_new));
    if (forward.kv_cache.seqlens_k.empty())
      return Status::invalid("kv_cache.seqlens_k: required (int32 [batch]), got a rank-0 tensor");
    AttentionOptions opts;
    CUFLASH_TRY(to_options(options, &opts));
    return attention_forward(forward, opts, to_context(context));
  });
}

cuflash_status cuflash_merge_states(const cuflash_merge_args* args, int32_t backend,
                                    const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    if (backend < CUFLASH_BACKEND_AUTO || backend > CUFLASH_BACKEND_CUDNN)
      return Status::invalid("backend: unknown backend code " + std::to_string(backend));
    MergeArgs merge;
    CUFLASH_TRY(to_view(args->out_a, "out_a", &merge.out_a));
    CUFLASH_TRY(to_view(args->lse_a, "lse_a", &merge.lse_a));
    CUFLASH_TRY(to_view(args->out_b, "out_b", &merge.out_b));
    CUFLASH_TRY(to_view(args->lse_b, "lse_b", &merge.lse_b));
    CUFLASH_TRY(to_view(args->out, "out", &merge.out));
    CUFLASH_TRY(to_view(args->lse, "lse", &merge.lse));
    return cuflash::merge_states(merge, static_cast<Backend>(backend), to_context(context));
  });
}

void cuflash_linear_options_init(cuflash_linear_options* options) {
  if (options == nullptr) return;
  *options = cuflash_linear_options{};
  options->causal = 1;
  options->feature_map = CUFLASH_FEATURE_IDENTITY;
  options->check_index_contents = 1;
  options->backend = CUFLASH_BACKEND_AUTO;
}

cuflash_status cuflash_linear_attention_forward(const cuflash_linear_forward_args* args,
                                                const cuflash_linear_options* options,
                                                const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    LinearForwardArgs a;
    CUFLASH_TRY(to_views({{&args->q, "q", &a.q},
                          {&args->k, "k", &a.k},
                          {&args->v, "v", &a.v},
                          {&args->out, "out", &a.out},
                          {&args->cu_seqlens, "cu_seqlens", &a.cu_seqlens},
                          {&args->initial_state, "initial_state", &a.initial_state},
                          {&args->initial_key_sum, "initial_key_sum", &a.initial_key_sum},
                          {&args->final_state, "final_state", &a.final_state},
                          {&args->final_key_sum, "final_key_sum", &a.final_key_sum}}));
    LinearAttentionOptions opts;
    CUFLASH_TRY(to_linear_options(options, &opts));
    return linear_attention_forward(a, opts, to_context(context));
  });
}

cuflash_status cuflash_linear_attention_backward(const cuflash_linear_backward_args* args,
                                                 const cuflash_linear_options* options,
                                                 const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    LinearBackwardArgs a;
    CUFLASH_TRY(to_views({{&args->q, "q", &a.q},
                          {&args->k, "k", &a.k},
                          {&args->v, "v", &a.v},
                          {&args->dout, "dout", &a.dout},
                          {&args->cu_seqlens, "cu_seqlens", &a.cu_seqlens},
                          {&args->initial_state, "initial_state", &a.initial_state},
                          {&args->initial_key_sum, "initial_key_sum", &a.initial_key_sum},
                          {&args->dfinal_state, "dfinal_state", &a.dfinal_state},
                          {&args->dfinal_key_sum, "dfinal_key_sum", &a.dfinal_key_sum},
                          {&args->dq, "dq", &a.dq},
                          {&args->dk, "dk", &a.dk},
                          {&args->dv, "dv", &a.dv},
                          {&args->dinitial_state, "dinitial_state", &a.dinitial_state},
                          {&args->dinitial_key_sum, "dinitial_key_sum", &a.dinitial_key_sum}}));
    LinearAttentionOptions opts;
    CUFLASH_TRY(to_linear_options(options, &opts));
    return linear_attention_backward(a, opts, to_context(context));
  });
}

cuflash_status cuflash_linear_attention_step(const cuflash_linear_step_args* args,
                                             const cuflash_linear_options* options,
                                             const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    LinearStepArgs a;
    CUFLASH_TRY(to_views({{&args->q, "q", &a.q},
                          {&args->k, "k", &a.k},
                          {&args->v, "v", &a.v},
                          {&args->out, "out", &a.out},
                          {&args->state, "state", &a.state},
                          {&args->key_sum, "key_sum", &a.key_sum},
                          {&args->state_out, "state_out", &a.state_out},
                          {&args->key_sum_out, "key_sum_out", &a.key_sum_out}}));
    LinearAttentionOptions opts;
    CUFLASH_TRY(to_linear_options(options, &opts));
    return linear_attention_step(a, opts, to_context(context));
  });
}

namespace {

Status to_ring_layout(int32_t layout, cuflash::RingLayout* out) {
  if (layout == CUFLASH_RING_CONTIGUOUS) *out = cuflash::RingLayout::contiguous;
  else if (layout == CUFLASH_RING_ZIGZAG) *out = cuflash::RingLayout::zigzag;
  else return Status::invalid("layout: expected CUFLASH_RING_CONTIGUOUS or CUFLASH_RING_ZIGZAG, got " + std::to_string(layout));
  return {};
}

}  // namespace

int cuflash_ring_attention_available(void) { return cuflash::ring_attention_available() ? 1 : 0; }

cuflash_status cuflash_ring_attention_forward(const cuflash_ring_forward_args* args, const cuflash_options* options,
                                              int32_t layout, ncclComm_t comm, const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    cuflash::RingForwardArgs ring;
    CUFLASH_TRY(to_view(&args->q, "q", &ring.q));
    CUFLASH_TRY(to_view(&args->k, "k", &ring.k));
    CUFLASH_TRY(to_view(&args->v, "v", &ring.v));
    CUFLASH_TRY(to_view(&args->out, "out", &ring.out));
    CUFLASH_TRY(to_view(&args->lse, "lse", &ring.lse));
    CUFLASH_TRY(to_view(&args->alibi_slopes, "alibi_slopes", &ring.alibi_slopes));
    CUFLASH_TRY(to_view(&args->cu_seqlens, "cu_seqlens", &ring.cu_seqlens));
    ring.max_seqlen = args->max_seqlen;
    AttentionOptions opts;
    CUFLASH_TRY(to_options(options, &opts));
    cuflash::RingLayout ring_layout;
    CUFLASH_TRY(to_ring_layout(layout, &ring_layout));
    return cuflash::ring_attention_forward(ring, opts, ring_layout, comm, to_context(context));
  });
}

cuflash_status cuflash_ring_attention_backward(const cuflash_ring_backward_args* args, const cuflash_options* options,
                                               int32_t layout, ncclComm_t comm, const cuflash_run_context* context) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    cuflash::RingBackwardArgs ring;
    CUFLASH_TRY(to_view(&args->q, "q", &ring.q));
    CUFLASH_TRY(to_view(&args->k, "k", &ring.k));
    CUFLASH_TRY(to_view(&args->v, "v", &ring.v));
    CUFLASH_TRY(to_view(&args->out, "out", &ring.out));
    CUFLASH_TRY(to_view(&args->dout, "dout", &ring.dout));
    CUFLASH_TRY(to_view(&args->lse, "lse", &ring.lse));
    CUFLASH_TRY(to_view(&args->dq, "dq", &ring.dq));
    CUFLASH_TRY(to_view(&args->dk, "dk", &ring.dk));
    CUFLASH_TRY(to_view(&args->dv, "dv", &ring.dv));
    CUFLASH_TRY(to_view(&args->alibi_slopes, "alibi_slopes", &ring.alibi_slopes));
    CUFLASH_TRY(to_view(&args->cu_seqlens, "cu_seqlens", &ring.cu_seqlens));
    ring.max_seqlen = args->max_seqlen;
    AttentionOptions opts;
    CUFLASH_TRY(to_options(options, &opts));
    cuflash::RingLayout ring_layout;
    CUFLASH_TRY(to_ring_layout(layout, &ring_layout));
    return cuflash::ring_attention_backward(ring, opts, ring_layout, comm, to_context(context));
  });
}

cuflash_status cuflash_forward_workspace_size(const cuflash_forward_args* args, const cuflash_options* options,
                                              size_t* bytes) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    CUFLASH_TRY(null_check(bytes, "bytes"));
    ForwardArgs forward;
    AttentionOptions opts;
    CUFLASH_TRY(to_forward(*args, &forward));
    CUFLASH_TRY(to_options(options, &opts));
    return forward_workspace_size(forward, opts, bytes);
  });
}

cuflash_status cuflash_backward_workspace_size(const cuflash_backward_args* args, const cuflash_options* options,
                                               size_t* bytes) {
  return guarded([&]() -> Status {
    CUFLASH_TRY(null_check(args, "args"));
    CUFLASH_TRY(null_check(bytes, "bytes"));
    BackwardArgs backward;
    AttentionOptions opts;
    CUFLASH_TRY(to_backward(*args, &backward));
    CUFLASH_TRY(to_options(options, &opts));
    return backward_workspace_size(backward, opts, bytes);
  });
}

}  // extern "C"
