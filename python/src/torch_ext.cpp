// cuflash/_ext_torch.so: cuflash's torch operators in C++, so that an eager
// call from Python is one call into the dispatcher and loss.backward() runs a
// C++ autograd node (a Python node costs torch's autograd engine ~300 us a
// call; docs/perf/NOTES.md, "Python path, first round").
//
// Built when the Python that builds the package can import torch (cmake/torch_ext.cmake);
// loaded by cuflash/_torch_ext.py with torch.ops.load_library. It is not a
// Python module: it registers, with TORCH_LIBRARY, the same operators that
// cuflash/_torch_py_ops.py defines in Python when it is absent (same names and
// schemas):
//
//   cuflash::fwd          dense, varlen or KV cache without append -> (out, lse)
//   cuflash::bwd          (dq, dk, dv, dsinks) from dout, q, k, v, out, lse (dsinks
//                         empty without sinks)
//   cuflash::fwd_kvcache  KV cache, appending k_new/v_new first (mutates the caches)
//
// fwd and bwd take attention sinks (Tensor? sinks: float32 [Hq], differentiable
// through fwd's node) and dropout (float dropout_p, Tensor? dropout_rng: the
// call's (seed, offset) as an int64 [2] tensor, read modulo 2**64; the backward
// gets the forward's and redraws the same mask) and a KV cache's leftpad (Tensor?
// cache_leftpad, saved by fwd's node for bwd); fwd_kvcache takes sinks, the
// leftpad and the rotary embedding of q and k_new (Tensor? rotary_cos,
// rotary_sin, bool rotary_interleaved). The
// debug probabilities (attn_probs) are no operator's output: cuflash/_torch_ext.py
// sends calls that ask for them to the Python path.
//   cuflash::merge_states (out, lse) of two partial attentions
//
// with, for each, one CPU and CUDA kernel (the cuflash C++ API on the tensors'
// memory: torch's current stream, outputs and scratch from torch's allocator),
// a Meta kernel (shapes only, symbolic sizes: what torch.compile traces), and
// for fwd an Autograd kernel whose node calls bwd; fwd_kvcache bumps the
// caches' version counters at ADInplaceOrView, as torch's in-place ops do.
//
// No CUDA header is included: the stream is read through c10's device-guard
// interface (which libc10_cuda registers when torch is imported), the
// workspace is an at::empty on the tensor's device, and whether the stream is
// capturing a CUDA graph is asked of libcuflash. The same source builds
// against CPU-only and CUDA builds of torch.
//
// Errors: a failed Status becomes c10::ValueError (invalid_argument: Python's
// ValueError, which cuflash/_torch_ext.py re-raises as InvalidArgumentError),
// c10::NotImplementedError (unsupported) or c10::Error (RuntimeError), with
// the library's message.
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "cuflash/cuflash.hpp"

#ifndef CUFLASH_TORCH_VERSION
#define CUFLASH_TORCH_VERSION "unknown"
#endif

// The torch version this file was compiled against, read from the file by
// cuflash/_torch_ext.py before it loads the library (a library built for
// another torch may not even load safely).
extern "C" __attribute__((visibility("default"), used)) const char cuflash_torch_ext_built_for[] =
    "cuflash-torch-ext-built-for:" CUFLASH_TORCH_VERSION ";";

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using cuflash::Status;
using cuflash::StatusCode;
using cuflash::TensorView;

// ---- tensors as views ---------------------------------------------------------------

[[noreturn]] void invalid(const std::string& message) { C10_THROW_ERROR(ValueError, message); }

[[noreturn]] void raise_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::invalid_argument: C10_THROW_ERROR(ValueError, status.message());
    case StatusCode::unsupported: C10_THROW_ERROR(NotImplementedError, status.message());
    default: C10_THROW_ERROR(Error, status.to_string());
  }
}

// The dtype's name as the DLPack path (python/src/cuflash_ext.cpp) spells it in its messages.
std::string dtype_name(at::ScalarType type) {
  switch (type) {
    case at::kByte: return "uint8";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kHalf: return "float16";
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kBFloat16: return "bfloat16";
    case at::kBool: return "bool";
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: return c10::toString(type);
  }
}

cuflash::DType to_dtype(at::ScalarType type, const char* name, bool index_tensor) {
  switch (type) {
    case at::kFloat: return cuflash::DType::f32;
    case at::kHalf: return cuflash::DType::f16;
    case at::kBFloat16: return cuflash::DType::bf16;
    case at::kInt: return cuflash::DType::i32;
    default:
      invalid(std::string(name) + ": dtype " + dtype_name(type) + " is not supported (expected " +
              (index_tensor ? "int32" : "float32, float16 or bfloat16") + ")");
  }
}

// A tensor as a view of its memory (what the DLPack path's to_view makes of it).
TensorView to_view(const Tensor& t, const char* name, bool index_tensor = false) {
  TensorView view;
  const int64_t rank = t.dim();
  if (rank == 0 || rank > cuflash::kMaxRank)
    invalid(std::string(name) + ": expected 1 to " + std::to_string(cuflash::kMaxRank) + " dimensions, got " +
            std::to_string(rank));
  view.dtype = to_dtype(t.scalar_type(), name, index_tensor);
  if (t.is_cpu()) {
    view.device = cuflash::Device::host();
  } else if (t.is_cuda()) {
    view.device = cuflash::Device::cuda(t.get_device());
  } else {
    invalid(std::string(name) + ": device " + t.device().str() + " is not supported (expected CPU or CUDA memory)");
  }
  view.data = const_cast<void*>(t.const_data_ptr());
  view.rank = static_cast<int>(rank);
  for (int64_t d = 0; d < rank; ++d) {
    view.shape[d] = t.size(d);
    view.strides[d] = t.stride(d);
  }
  return view;
}

TensorView to_view(const OptTensor& t, const char* name, bool index_tensor = false) {
  return t && t->defined() ? to_view(*t, name, index_tensor) : TensorView{};
}

// ---- where a call runs ----------------------------------------------------------------

// torch's current stream on t's device (nullptr for host tensors).
void* current_stream(const Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  static const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return cuda->getStream(t.device()).native_handle();
}

// RunContext::allocator over torch's caching allocator (inside a CUDA-graph
// capture, the graph's private pool): the blocks live until the call has
// enqueued its kernels on the current stream, which is the stream they were
// allocated for, so freeing them afterwards is safe in stream order.
class Workspace {
 public:
  explicit Workspace(const Tensor& like) : device_(like.device()) {}

  cuflash::RunContext context(void* stream) {
    cuflash::RunContext context;
    context.stream = stream;
    if (device_.is_cuda()) {
      context.allocator.allocate = [](std::size_t bytes, void*, void* state) -> void* {
        auto* self = static_cast<Workspace*>(state);
        try {
          self->blocks_.push_back(
              at::empty({static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte).device(self->device_)));
          return self->blocks_.back().data_ptr();
        } catch (const std::exception&) {
          return nullptr;  // the call reports it as a Status (out of memory)
        }
      };
      context.allocator.state = this;
    }
    return context;
  }

 private:
  c10::Device device_;
  std::vector<Tensor> blocks_;
};

cuflash::Backend to_backend(std::string_view name) {
  if (name == "auto") return cuflash::Backend::automatic;
  if (name == "cpu") return cuflash::Backend::cpu;
  if (name == "cuda") return cuflash::Backend::cuda;
  if (name == "cudnn") return cuflash::Backend::cudnn;
  invalid("backend: expected one of 'auto', 'cpu', 'cuda', 'cudnn', got '" + std::string(name) + "'");
}

int to_int(int64_t value, const char* name) {
  if (value < INT32_MIN || value > INT32_MAX)
    invalid(std::string(name) + ": expected an integer in [" + std::to_string(INT32_MIN) + ", " +
            std::to_string(INT32_MAX) + "], got " + std::to_string(value));
  return static_cast<int>(value);
}

// The options of a call. With index tensors on a stream that is capturing a
// CUDA graph, their contents cannot be copied to the host to be checked (that
// waits on the stream): the capture leaves the check to the eager calls made
// before it, as the Python path does (README, CUDA graphs).
cuflash::AttentionOptions make_options(std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, bool deterministic,
                                       bool check_index_contents, std::string_view backend, bool indexed,
                                       void* stream, const Tensor& q, double dropout_p = 0.0,
                                       const OptTensor& dropout_rng = std::nullopt) {
  cuflash::AttentionOptions options;
  options.dropout_p = static_cast<float>(dropout_p);
  if (dropout_rng && dropout_rng->defined()) {
    // (seed, offset) as int64 [2]; read as unsigned 64-bit, the two's complement the Python side writes.
    const Tensor& rng = *dropout_rng;
    if (rng.scalar_type() != at::kLong || rng.numel() != 2)
      invalid("dropout_rng: expected an int64 tensor of 2 elements (seed, offset), got " +
              dtype_name(rng.scalar_type()) + " of " + std::to_string(rng.numel()));
    const Tensor host = rng.is_cpu() ? rng.contiguous() : rng.cpu().contiguous();
    const int64_t* values = host.const_data_ptr<int64_t>();
    options.dropout_seed = static_cast<std::uint64_t>(values[0]);
    options.dropout_offset = static_cast<std::uint64_t>(values[1]);
  }
  if (softmax_scale) options.softmax_scale = static_cast<float>(*softmax_scale);
  options.causal = causal;
  options.window_left = to_int(window_left, "window_size[0]");
  options.window_right = to_int(window_right, "window_size[1]");
  options.softcap = static_cast<float>(softcap);
  options.deterministic = deterministic;
  options.check_index_contents =
      check_index_contents && !(indexed && q.is_cuda() && cuflash::stream_capturing(stream));
  options.backend = to_backend(backend);
  return options;
}

template <typename Args>
void set_indices(const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k, int64_t max_seqlen_q,
                 int64_t max_seqlen_k, const OptTensor& seqlens_k, const OptTensor& block_table,
                 const OptTensor& cache_leftpad, Args* args) {
  args->varlen.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q", true);
  args->varlen.cu_seqlens_k = to_view(cu_seqlens_k, "cu_seqlens_k", true);
  args->varlen.max_seqlen_q = to_int(max_seqlen_q, "max_seqlen_q");
  args->varlen.max_seqlen_k = to_int(max_seqlen_k, "max_seqlen_k");
  args->kv_cache.seqlens_k = to_view(seqlens_k, "seqlens_k", true);
  args->kv_cache.block_table = to_view(block_table, "block_table", true);
  args->kv_cache.leftpad = to_view(cache_leftpad, "cache_leftpad", true);
}

bool given(const OptTensor& t) { return t && t->defined(); }

// ---- CPU and CUDA kernels ---------------------------------------------------------------

// out like q (zeros for varlen: packed rows after the last sequence belong to
// none and are not written); lse float32 [B, Hq, Sq] or, varlen, [Hq, Tq]. A q
// of another rank gets an lse of no element and the library's message about q.
std::tuple<Tensor, Tensor> outputs_like(const Tensor& q, bool varlen) {
  Tensor out = varlen ? at::zeros(q.sizes(), q.options()) : at::empty(q.sizes(), q.options());
  const auto lse_options = q.options().dtype(at::kFloat);
  Tensor lse;
  if (varlen && q.dim() == 3)
    lse = at::empty({q.size(1), q.size(0)}, lse_options);
  else if (!varlen && q.dim() == 4)
    lse = at::empty({q.size(0), q.size(2), q.size(1)}, lse_options);
  else
    lse = at::empty({0}, lse_options);
  return {out, lse};
}

std::tuple<Tensor, Tensor> run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& alibi_slopes,
                                       const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                                       int64_t max_seqlen_q, int64_t max_seqlen_k, const OptTensor& seqlens_k,
                                       const OptTensor& block_table, const OptTensor& k_new, const OptTensor& v_new,
                                       std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                       int64_t window_right, double softcap, bool deterministic,
                                       bool check_index_contents, std::string_view backend, const OptTensor& sinks,
                                       double dropout_p, const OptTensor& dropout_rng, const OptTensor& cache_leftpad,
                                       const OptTensor& rotary_cos = std::nullopt,
                                       const OptTensor& rotary_sin = std::nullopt, bool rotary_interleaved = false) {
  const bool varlen = given(cu_seqlens_q);
  const bool indexed = varlen || given(seqlens_k) || given(block_table) || given(cache_leftpad);
  void* stream = current_stream(q);
  const cuflash::AttentionOptions options =
      make_options(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents,
                   backend, indexed, stream, q, dropout_p, dropout_rng);
  auto [out, lse] = outputs_like(q, varlen);
  cuflash::ForwardArgs args;
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "lse");
  args.alibi_slopes = to_view(alibi_slopes, "alibi_slopes");
  set_indices(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k, block_table, cache_leftpad, &args);
  args.kv_cache.k_new = to_view(k_new, "k_new");
  args.kv_cache.v_new = to_view(v_new, "v_new");
  args.kv_cache.rotary_cos = to_view(rotary_cos, "rotary_cos");
  args.kv_cache.rotary_sin = to_view(rotary_sin, "rotary_sin");
  args.kv_cache.rotary_interleaved = rotary_interleaved;
  args.sinks = to_view(sinks, "sinks");
  Workspace workspace(q);
  const Status status = cuflash::attention_forward(args, options, workspace.context(stream));
  if (!status.ok()) raise_status(status);
  return {out, lse};
}

std::tuple<Tensor, Tensor> fwd_kernel(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& alibi_slopes,
                                      const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
                                      int64_t max_seqlen_q, int64_t max_seqlen_k, const OptTensor& seqlens_k,
                                      const OptTensor& block_table, std::optional<double> softmax_scale, bool causal,
                                      int64_t window_left, int64_t window_right, double softcap, bool deterministic,
                                      bool check_index_contents, c10::string_view backend, const OptTensor& sinks,
                                      double dropout_p, const OptTensor& dropout_rng, const OptTensor& cache_leftpad) {
  return run_forward(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k,
                     block_table, std::nullopt, std::nullopt, softmax_scale, causal, window_left, window_right, softcap,
                     deterministic, check_index_contents, backend, sinks, dropout_p, dropout_rng, cache_leftpad);
}

std::tuple<Tensor, Tensor> fwd_kvcache_kernel(const Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& k_new,
                                              const Tensor& v_new, const Tensor& seqlens_k,
                                              const OptTensor& block_table, const OptTensor& alibi_slopes,
                                              std::optional<double> softmax_scale, bool causal, int64_t window_left,
                                              int64_t window_right, double softcap, bool check_index_contents,
                                              c10::string_view backend, const OptTensor& sinks,
                                              const OptTensor& cache_leftpad, const OptTensor& rotary_cos,
                                              const OptTensor& rotary_sin, bool rotary_interleaved) {
  return run_forward(q, k_cache, v_cache, alibi_slopes, std::nullopt, std::nullopt, 0, 0, seqlens_k, block_table, k_new,
                     v_new, softmax_scale, causal, window_left, window_right, softcap, false, check_index_contents,
                     backend, sinks, 0.0, std::nullopt, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved);
}

// (dq, dk, dv, dsinks): dsinks float32 like sinks, or of no element without sinks.
std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_kernel(
    const Tensor& dout_given, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
    const OptTensor& alibi_slopes, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const OptTensor& seqlens_k, const OptTensor& block_table, std::optional<double> softmax_scale,
    bool causal, int64_t window_left, int64_t window_right, double softcap, bool deterministic,
    bool check_index_contents, c10::string_view backend, const OptTensor& sinks, double dropout_p,
    const OptTensor& dropout_rng, const OptTensor& cache_leftpad) {
  // e.g. the expanded ones of out.sum(): the library wants the last dimension contiguous
  const Tensor dout = dout_given.dim() > 0 && dout_given.stride(-1) != 1 ? dout_given.contiguous() : dout_given;
  const bool indexed = given(cu_seqlens_q) || given(seqlens_k) || given(block_table) || given(cache_leftpad);
  void* stream = current_stream(q);
  const cuflash::AttentionOptions options =
      make_options(softmax_scale, causal, window_left, window_right, softcap, deterministic, check_index_contents,
                   backend, indexed, stream, q, dropout_p, dropout_rng);
  Tensor dq = at::empty(q.sizes(), q.options());
  Tensor dk = at::empty(k.sizes(), k.options());
  Tensor dv = at::empty(v.sizes(), v.options());
  Tensor dsinks = given(sinks) ? at::empty(sinks->sizes(), sinks->options().dtype(at::kFloat))
                               : at::empty({0}, q.options().dtype(at::kFloat));
  cuflash::BackwardArgs args;
  args.dout = to_view(dout, "dout");
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "lse");
  args.dq = to_view(dq, "dq");
  args.dk = to_view(dk, "dk");
  args.dv = to_view(dv, "dv");
  args.alibi_slopes = to_view(alibi_slopes, "alibi_slopes");
  set_indices(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k, block_table, cache_leftpad, &args);
  if (given(sinks)) {
    args.sinks = to_view(sinks, "sinks");
    args.dsinks = to_view(dsinks, "dsinks");
  }
  Workspace workspace(q);
  const Status status = cuflash::attention_backward(args, options, workspace.context(stream));
  if (!status.ok()) raise_status(status);
  return {dq, dk, dv, dsinks};
}

std::tuple<Tensor, Tensor> merge_states_kernel(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                                               const Tensor& lse_b, c10::string_view backend) {
  const cuflash::Backend chosen = to_backend(backend);
  Tensor out = at::empty(out_a.sizes(), out_a.options());
  Tensor lse = at::empty(lse_a.sizes(), lse_a.options().dtype(at::kFloat));
  cuflash::MergeArgs args;
  args.out_a = to_view(out_a, "out_a");
  args.lse_a = to_view(lse_a, "lse_a");
  args.out_b = to_view(out_b, "out_b");
  args.lse_b = to_view(lse_b, "lse_b");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "lse");
  Workspace workspace(out_a);
  const Status status = cuflash::merge_states(args, chosen, workspace.context(current_stream(out_a)));
  if (!status.ok()) raise_status(status);
  return {out, lse};
}

// ---- Meta kernels: shapes only, sizes possibly symbolic ------------------------------------

std::tuple<Tensor, Tensor> meta_outputs(const Tensor& q, bool varlen) {
  Tensor out = at::empty_symint(q.sym_sizes(), q.options());
  const auto lse_options = q.options().dtype(at::kFloat);
  Tensor lse;
  if (varlen && q.dim() == 3)
    lse = at::empty_symint({q.sym_size(1), q.sym_size(0)}, lse_options);
  else if (!varlen && q.dim() == 4)
    lse = at::empty_symint({q.sym_size(0), q.sym_size(2), q.sym_size(1)}, lse_options);
  else
    lse = at::empty({0}, lse_options);
  return {out, lse};
}

std::tuple<Tensor, Tensor> fwd_meta(const Tensor& q, const Tensor&, const Tensor&, const OptTensor&,
                                    const OptTensor& cu_seqlens_q, const OptTensor&, c10::SymInt, c10::SymInt,
                                    const OptTensor&, const OptTensor&, std::optional<double>, bool, c10::SymInt,
                                    c10::SymInt, double, bool, bool, c10::string_view, const OptTensor&, double,
                                    const OptTensor&, const OptTensor&) {
  return meta_outputs(q, given(cu_seqlens_q));
}

std::tuple<Tensor, Tensor> fwd_kvcache_meta(const Tensor& q, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                            const Tensor&, const OptTensor&, const OptTensor&, std::optional<double>,
                                            bool, c10::SymInt, c10::SymInt, double, bool, c10::string_view,
                                            const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                            bool) {
  return meta_outputs(q, false);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> bwd_meta(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                                                    const OptTensor&, c10::SymInt, c10::SymInt, const OptTensor&,
                                                    const OptTensor&, std::optional<double>, bool, c10::SymInt,
                                                    c10::SymInt, double, bool, bool, c10::string_view,
                                                    const OptTensor& sinks, double, const OptTensor&,
                                                    const OptTensor&) {
  Tensor dsinks = given(sinks) ? at::empty_symint(sinks->sym_sizes(), sinks->options().dtype(at::kFloat))
                               : at::empty({0}, q.options().dtype(at::kFloat));
  return {at::empty_symint(q.sym_sizes(), q.options()), at::empty_symint(k.sym_sizes(), k.options()),
          at::empty_symint(v.sym_sizes(), v.options()), dsinks};
}

std::tuple<Tensor, Tensor> merge_states_meta(const Tensor& out_a, const Tensor& lse_a, const Tensor&, const Tensor&,
                                             c10::string_view) {
  return {at::empty_symint(out_a.sym_sizes(), out_a.options()),
          at::empty_symint(lse_a.sym_sizes(), lse_a.options().dtype(at::kFloat))};
}

// ---- autograd ---------------------------------------------------------------------------

using FwdSignature = std::tuple<Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
                                                const OptTensor&, const OptTensor&, c10::SymInt, c10::SymInt,
                                                const OptTensor&, const OptTensor&, std::optional<double>, bool,
                                                c10::SymInt, c10::SymInt, double, bool, bool, c10::string_view,
                                                const OptTensor&, double, const OptTensor&, const OptTensor&);
using BwdSignature = std::tuple<Tensor, Tensor, Tensor, Tensor>(
    const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, c10::SymInt, c10::SymInt, const OptTensor&, const OptTensor&,
    std::optional<double>, bool, c10::SymInt, c10::SymInt, double, bool, bool, c10::string_view, const OptTensor&,
    double, const OptTensor&, const OptTensor&);
using KvcacheSignature = std::tuple<Tensor, Tensor>(const Tensor&, Tensor&, Tensor&, const Tensor&, const Tensor&,
                                                    const Tensor&, const OptTensor&, const OptTensor&,
                                                    std::optional<double>, bool, c10::SymInt, c10::SymInt, double,
                                                    bool, c10::string_view, const OptTensor&, const OptTensor&,
                                                    const OptTensor&, const OptTensor&, bool);

const c10::TypedOperatorHandle<FwdSignature>& fwd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cuflash::fwd", "").typed<FwdSignature>();
  return op;
}
const c10::TypedOperatorHandle<BwdSignature>& bwd_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cuflash::bwd", "").typed<BwdSignature>();
  return op;
}
const c10::TypedOperatorHandle<KvcacheSignature>& kvcache_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("cuflash::fwd_kvcache", "").typed<KvcacheSignature>();
  return op;
}

OptTensor optional(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }

// fwd's node: saves q, k, v, out, lse, the index tensors, sinks and the
// dropout (seed, offset); its backward calls cuflash::bwd (through the
// dispatcher, so that torch.compile traces it too), which redraws the forward's
// dropout mask from them, and returns dsinks for sinks. lse is not
// differentiable, and a gradient through it is not propagated (as in flash-attn).
struct Attention : torch::autograd::Function<Attention> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
      const OptTensor& alibi_slopes, const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_k,
      const c10::SymInt& max_seqlen_q, const c10::SymInt& max_seqlen_k, const OptTensor& seqlens_k,
      const OptTensor& block_table, std::optional<double> softmax_scale, bool causal, const c10::SymInt& window_left,
      const c10::SymInt& window_right, double softcap, bool deterministic, bool check_index_contents,
      c10::string_view backend, const OptTensor& sinks, double dropout_p, const OptTensor& dropout_rng,
      const OptTensor& cache_leftpad) {
    at::AutoDispatchBelowADInplaceOrView below;
    auto [out, lse] = fwd_op().call(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    seqlens_k, block_table, softmax_scale, causal, window_left, window_right, softcap,
                                    deterministic, check_index_contents, backend, sinks, dropout_p, dropout_rng,
                                    cache_leftpad);
    ctx->save_for_backward({q, k, v, out, lse, alibi_slopes.value_or(Tensor()), cu_seqlens_q.value_or(Tensor()),
                            cu_seqlens_k.value_or(Tensor()), seqlens_k.value_or(Tensor()),
                            block_table.value_or(Tensor()), sinks.value_or(Tensor()),
                            dropout_rng.value_or(Tensor()), cache_leftpad.value_or(Tensor())});
    ctx->saved_data["options"] = c10::ivalue::Tuple::create(
        {max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap, deterministic,
         check_index_contents, std::string(backend), dropout_p});
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor& out = saved[3];
    const auto& o = ctx->saved_data["options"].toTupleRef().elements();
    const Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(out);
    const OptTensor sinks = optional(saved[10]);
    auto [dq, dk, dv, dsinks] = bwd_op().call(
        dout, saved[0], saved[1], saved[2], out, saved[4], optional(saved[5]), optional(saved[6]), optional(saved[7]),
        o[0].toSymInt(), o[1].toSymInt(), optional(saved[8]), optional(saved[9]), o[2].toOptional<double>(),
        o[3].toBool(), o[4].toSymInt(), o[5].toSymInt(), o[6].toDouble(), o[7].toBool(), o[8].toBool(),
        o[9].toStringRef(), sinks, o[10].toDouble(), optional(saved[11]), optional(saved[12]));
    torch::autograd::variable_list result(kInputs);  // one per forward argument; q, k, v and sinks have one
    result[0] = dq;
    result[1] = dk;
    result[2] = dv;
    if (sinks) result[kSinks] = dsinks;
    return result;
  }

  static constexpr std::size_t kInputs = 22;  // fwd's arguments
  static constexpr std::size_t kSinks = 18;   // where sinks is among them
};

bool requires_grad(const OptTensor& t) { return given(t) && t->requires_grad(); }

std::tuple<Tensor, Tensor> fwd_autograd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const OptTensor& alibi_slopes, const OptTensor& cu_seqlens_q,
                                        const OptTensor& cu_seqlens_k, c10::SymInt max_seqlen_q,
                                        c10::SymInt max_seqlen_k, const OptTensor& seqlens_k,
                                        const OptTensor& block_table, std::optional<double> softmax_scale, bool causal,
                                        c10::SymInt window_left, c10::SymInt window_right, double softcap,
                                        bool deterministic, bool check_index_contents, c10::string_view backend,
                                        const OptTensor& sinks, double dropout_p, const OptTensor& dropout_rng,
                                        const OptTensor& cache_leftpad) {
  if (!(at::GradMode::is_enabled() &&
        (q.requires_grad() || k.requires_grad() || v.requires_grad() || requires_grad(sinks)))) {
    // No gradient asked for: no node (what the Python path's attention_eager skips too).
    at::AutoDispatchBelowADInplaceOrView below;
    return fwd_op().call(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k,
                         block_table, softmax_scale, causal, window_left, window_right, softcap, deterministic,
                         check_index_contents, backend, sinks, dropout_p, dropout_rng, cache_leftpad);
  }
  auto outputs = Attention::apply(q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  seqlens_k, block_table, softmax_scale, causal, window_left, window_right, softcap,
                                  deterministic, check_index_contents, backend, sinks, dropout_p, dropout_rng,
                                  cache_leftpad);
  return {outputs[0], outputs[1]};
}

// The KV-cache append writes into the caches: their version counters are
// bumped, as torch's in-place ops do, so that autograd sees the change.
std::tuple<Tensor, Tensor> fwd_kvcache_inplace(const Tensor& q, Tensor& k_cache, Tensor& v_cache, const Tensor& k_new,
                                               const Tensor& v_new, const Tensor& seqlens_k,
                                               const OptTensor& block_table, const OptTensor& alibi_slopes,
                                               std::optional<double> softmax_scale, bool causal,
                                               c10::SymInt window_left, c10::SymInt window_right, double softcap,
                                               bool check_index_contents, c10::string_view backend,
                                               const OptTensor& sinks, const OptTensor& cache_leftpad,
                                               const OptTensor& rotary_cos, const OptTensor& rotary_sin,
                                               bool rotary_interleaved) {
  std::tuple<Tensor, Tensor> result;
  {
    at::AutoDispatchBelowADInplaceOrView below;
    result = kvcache_op().call(q, k_cache, v_cache, k_new, v_new, seqlens_k, block_table, alibi_slopes,
                               softmax_scale, causal, window_left, window_right, softcap, check_index_contents,
                               backend, sinks, cache_leftpad, rotary_cos, rotary_sin, rotary_interleaved);
  }
  // Inference tensors have no version counter (their keys skip this kernel, but another
  // argument's may bring it here); the Python path writes them without a bump too.
  if (!k_cache.is_inference()) torch::autograd::impl::bump_version(k_cache);
  if (!v_cache.is_inference()) torch::autograd::impl::bump_version(v_cache);
  return result;
}

}  // namespace

// The schemas are those torch.library.custom_op infers for cuflash/_torch_py_ops.py.
TORCH_LIBRARY(cuflash, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? alibi_slopes, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
      "SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? seqlens_k, Tensor? block_table, float? softmax_scale, "
      "bool causal, SymInt window_left, SymInt window_right, float softcap, bool deterministic, "
      "bool check_index_contents, str backend, Tensor? sinks=None, float dropout_p=0., Tensor? dropout_rng=None, "
      "Tensor? cache_leftpad=None) -> (Tensor, Tensor)");
  m.def(
      "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? alibi_slopes, "
      "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? seqlens_k, "
      "Tensor? block_table, float? softmax_scale, bool causal, SymInt window_left, SymInt window_right, "
      "float softcap, bool deterministic, bool check_index_contents, str backend, Tensor? sinks=None, "
      "float dropout_p=0., Tensor? dropout_rng=None, Tensor? cache_leftpad=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "fwd_kvcache(Tensor q, Tensor(a0!) k_cache, Tensor(a1!) v_cache, Tensor k_new, Tensor v_new, "
      "Tensor seqlens_k, Tensor? block_table, Tensor? alibi_slopes, float? softmax_scale, bool causal, "
      "SymInt window_left, SymInt window_right, float softcap, bool check_index_contents, str backend, "
      "Tensor? sinks=None, Tensor? cache_leftpad=None, Tensor? rotary_cos=None, Tensor? rotary_sin=None, "
      "bool rotary_interleaved=False) -> (Tensor, Tensor)");
  m.def("merge_states(Tensor out_a, Tensor lse_a, Tensor out_b, Tensor lse_b, str backend) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(cuflash, CPU, m) {
  m.impl("fwd", &fwd_kernel);
  m.impl("bwd", &bwd_kernel);
  m.impl("fwd_kvcache", &fwd_kvcache_kernel);
  m.impl("merge_states", &merge_states_kernel);
}

TORCH_LIBRARY_IMPL(cuflash, CUDA, m) {
  m.impl("fwd", &fwd_kernel);
  m.impl("bwd", &bwd_kernel);
  m.impl("fwd_kvcache", &fwd_kvcache_kernel);
  m.impl("merge_states", &merge_states_kernel);
}

TORCH_LIBRARY_IMPL(cuflash, Meta, m) {
  m.impl("fwd", &fwd_meta);
  m.impl("bwd", &bwd_meta);
  m.impl("fwd_kvcache", &fwd_kvcache_meta);
  m.impl("merge_states", &merge_states_meta);
}

TORCH_LIBRARY_IMPL(cuflash, Autograd, m) {
  m.impl("fwd", &fwd_autograd);
  // Appends are not differentiable (as in flash-attn): below autograd, straight to the version bump.
  m.impl("fwd_kvcache", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(cuflash, ADInplaceOrView, m) { m.impl("fwd_kvcache", &fwd_kvcache_inplace); }
