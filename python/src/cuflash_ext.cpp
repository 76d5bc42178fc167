// cuflash._ext: the C++ API for Python through nanobind. It takes DLPack
// tensors of any framework as they are (no copies: a DLPack capsule, or an
// object nanobind reads through __dlpack__ or the buffer protocol), turns
// them into TensorViews, runs the call with the GIL released, and turns a
// failed Status into InvalidArgumentError (a ValueError and a RuntimeError;
// invalid_argument), NotImplementedError (unsupported) or RuntimeError (CUDA,
// cuDNN, internal). Outputs are
// allocated by the Python layer, in the caller's framework; this module only
// writes through views. Argument types are checked by the Python layer
// (cuflash/_args.py) before they get here, so that a wrong type is a
// ValueError naming the argument rather than nanobind's TypeError.
//
// Per call the options cross as one Options object (built once per distinct
// set of options by the Python layer), and scratch memory comes from the
// caller's framework through `workspace`, a callable (bytes) -> array whose
// memory the call may use on its stream (torch's caching allocator, which
// also serves CUDA-graph captures from the graph's own pool).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuflash/cuflash.hpp"
#include "cuflash/ring_schedule.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using cuflash::AttentionOptions;
using cuflash::Backend;
using cuflash::DType;
using cuflash::Status;
using cuflash::StatusCode;
using cuflash::TensorView;

// Any dtype, device and shape; read-only arrays (e.g. a numpy array with
// writeable=False) are accepted as inputs.
using Array = nb::ndarray<nb::ro>;

struct InvalidArgument : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct LibraryError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void raise_status(const Status& status) {
  switch (status.code()) {
    case StatusCode::invalid_argument: throw InvalidArgument(status.message());
    case StatusCode::unsupported: throw Unsupported(status.message());
    default: throw LibraryError(status.to_string());
  }
}

std::string dlpack_dtype_name(const nb::dlpack::dtype& dtype) {
  std::string kind;
  switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: kind = "code" + std::to_string(dtype.code) + "_"; break;
  }
  std::string name = kind + std::to_string(dtype.bits);
  if (dtype.lanes != 1) name += "x" + std::to_string(dtype.lanes);
  return name;
}

DType to_dtype(const nb::dlpack::dtype& dtype, const char* name, bool index_tensor) {
  if (dtype.lanes == 1) {
    const auto code = static_cast<nb::dlpack::dtype_code>(dtype.code);
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 32) return DType::f32;
    if (code == nb::dlpack::dtype_code::Float && dtype.bits == 16) return DType::f16;
    if (code == nb::dlpack::dtype_code::Bfloat && dtype.bits == 16) return DType::bf16;
    if (code == nb::dlpack::dtype_code::Int && dtype.bits == 32) return DType::i32;
  }
  throw InvalidArgument(std::string(name) + ": dtype " + dlpack_dtype_name(dtype) + " is not supported (expected " +
                        (index_tensor ? "int32" : "float32, float16 or bfloat16") + ")");
}

bool is_index_tensor(const std::string& name) {
  return name == "cu_seqlens" || name == "cu_seqlens_q" || name == "cu_seqlens_k" || name == "seqlens_k" ||
         name == "block_table" || name == "cache_leftpad";
}

// A DLPack array as a view of the same memory; an absent (None) array as an
// empty view, which the library reads as "not given".
TensorView to_view(const Array& array, const char* name) {
  TensorView view;
  if (!array.is_valid()) return view;
  const std::size_t rank = array.ndim();
  if (rank == 0 || rank > static_cast<std::size_t>(cuflash::kMaxRank))
    throw InvalidArgument(std::string(name) + ": expected 1 to " + std::to_string(cuflash::kMaxRank) +
                          " dimensions, got " + std::to_string(rank));
  view.dtype = to_dtype(array.dtype(), name, is_index_tensor(name));
  switch (array.device_type()) {
    case nb::device::cpu::value:
    case nb::device::cuda_host::value: view.device = cuflash::Device::host(); break;
    case nb::device::cuda::value:
    case nb::device::cuda_managed::value: view.device = cuflash::Device::cuda(array.device_id()); break;
    default:
      throw InvalidArgument(std::string(name) + ": DLPack device type " + std::to_string(array.device_type()) +
                            " is not supported (expected CPU or CUDA memory)");
  }
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.rank = static_cast<int>(rank);
  for (std::size_t d = 0; d < rank; ++d) {
    view.shape[d] = static_cast<std::int64_t>(array.shape(d));
    view.strides[d] = array.stride(d);
  }
  return view;
}

TensorView to_view(const std::optional<Array>& array, const char* name) {
  return array ? to_view(*array, name) : TensorView{};
}

// RunContext::allocator over a Python callable (bytes) -> array with a
// data_ptr() (a torch tensor): the arrays it made are kept alive until the
// call has enqueued its kernels, then dropped with the GIL held.
class PythonWorkspace {
 public:
  explicit PythonWorkspace(nb::handle make) : make_(make) {}
  ~PythonWorkspace() {
    nb::gil_scoped_acquire gil;
    arrays_.clear();
  }
  PythonWorkspace(const PythonWorkspace&) = delete;
  PythonWorkspace& operator=(const PythonWorkspace&) = delete;

  cuflash::WorkspaceAllocator allocator() {
    cuflash::WorkspaceAllocator allocator;
    if (make_.is_none()) return allocator;
    allocator.allocate = [](std::size_t bytes, void*, void* state) -> void* {
      auto* self = static_cast<PythonWorkspace*>(state);
      nb::gil_scoped_acquire gil;
      try {
        nb::object array = self->make_(bytes);
        void* pointer = reinterpret_cast<void*>(nb::cast<std::uintptr_t>(array.attr("data_ptr")()));
        self->arrays_.push_back(std::move(array));
        return pointer;
      } catch (const std::exception&) {
        PyErr_Clear();  // the call reports the failure as a Status
        return nullptr;
      }
    };
    allocator.state = this;
    return allocator;
  }

 private:
  nb::handle make_;
  std::vector<nb::object> arrays_;
};

Backend to_backend(const std::string& name) {
  if (name == "auto") return Backend::automatic;
  if (name == "cpu") return Backend::cpu;
  if (name == "cuda") return Backend::cuda;
  if (name == "cudnn") return Backend::cudnn;
  throw InvalidArgument("backend: expected 'auto', 'cpu', 'cuda' or 'cudnn', got '" + name + "'");
}

AttentionOptions make_options(std::optional<double> softmax_scale, bool causal, int window_left, int window_right,
                              double softcap, bool deterministic, bool check_index_contents, const std::string& backend,
                              double dropout_p) {
  AttentionOptions options;
  options.dropout_p = static_cast<float>(dropout_p);
  if (softmax_scale) options.softmax_scale = static_cast<float>(*softmax_scale);
  options.causal = causal;
  options.window_left = window_left;
  options.window_right = window_right;
  options.softcap = static_cast<float>(softcap);
  options.deterministic = deterministic;
  options.check_index_contents = check_index_contents;
  options.backend = to_backend(backend);
  return options;
}

cuflash::RunContext to_context(std::uintptr_t stream, PythonWorkspace& workspace) {
  cuflash::RunContext context;
  context.stream = reinterpret_cast<void*>(stream);
  context.allocator = workspace.allocator();
  return context;
}

using OptArray = std::optional<Array>;

// The varlen and KV-cache index views of ForwardArgs or BackwardArgs.
template <typename Args>
void set_batch_indices(const OptArray& cu_seqlens_q, const OptArray& cu_seqlens_k, int max_seqlen_q,
                       int max_seqlen_k, const OptArray& seqlens_k, const OptArray& block_table,
                       const OptArray& cache_leftpad, Args* args) {
  args->varlen.cu_seqlens_q = to_view(cu_seqlens_q, "cu_seqlens_q");
  args->varlen.cu_seqlens_k = to_view(cu_seqlens_k, "cu_seqlens_k");
  args->varlen.max_seqlen_q = max_seqlen_q;
  args->varlen.max_seqlen_k = max_seqlen_k;
  args->kv_cache.seqlens_k = to_view(seqlens_k, "seqlens_k");
  args->kv_cache.block_table = to_view(block_table, "block_table");
  args->kv_cache.leftpad = to_view(cache_leftpad, "cache_leftpad");
}

using RingCallTuple = std::tuple<int, int, int, int, bool, int, int, std::optional<std::int64_t>>;

std::vector<RingCallTuple> ring_step_calls(const std::string& layout, int world_size, int rank, int kv_rank,
                                           bool causal, int window_left, int window_right, bool alibi, bool varlen,
                                           std::int64_t chunk_len) {
  cuflash::RingLayout ring_layout;
  if (layout == "zigzag")
    ring_layout = cuflash::RingLayout::zigzag;
  else if (layout == "contiguous")
    ring_layout = cuflash::RingLayout::contiguous;
  else
    throw InvalidArgument("layout: expected 'zigzag' or 'contiguous', got '" + layout + "'");
  std::vector<cuflash::RingCall> calls;
  const Status status = cuflash::ring_step_calls(ring_layout, world_size, rank, kv_rank,
                                                 {causal, window_left, window_right, alibi}, varlen, chunk_len, &calls);
  if (!status.ok()) raise_status(status);
  std::vector<RingCallTuple> tuples;
  for (const cuflash::RingCall& c : calls)
    tuples.emplace_back(c.q_first, c.q_count, c.k_first, c.k_count, c.causal, c.window_left, c.window_right,
                        c.diagonal_offset);
  return tuples;
}

// The options of one call: the shared object, with this call's dropout seed
// and offset (which change per call, so they are not part of the cached object).
AttentionOptions with_dropout_rng(const AttentionOptions& options, std::uint64_t seed, std::uint64_t offset) {
  AttentionOptions call = options;
  call.dropout_seed = seed;
  call.dropout_offset = offset;
  return call;
}

void forward(const Array& q, const Array& k, const Array& v, const Array& out, const OptArray& lse,
             const AttentionOptions& shared_options, std::uintptr_t stream, nb::handle workspace,
             const OptArray& alibi_slopes, const OptArray& cu_seqlens_q, const OptArray& cu_seqlens_k,
             int max_seqlen_q, int max_seqlen_k, const OptArray& seqlens_k, const OptArray& block_table,
             const OptArray& k_new, const OptArray& v_new, const OptArray& sinks, const OptArray& attn_probs,
             std::uint64_t dropout_seed, std::uint64_t dropout_offset, const OptArray& cache_leftpad,
             const OptArray& rotary_cos, const OptArray& rotary_sin, bool rotary_interleaved) {
  const AttentionOptions options = with_dropout_rng(shared_options, dropout_seed, dropout_offset);
  cuflash::ForwardArgs args;
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "lse");
  args.alibi_slopes = to_view(alibi_slopes, "alibi_slopes");
  set_batch_indices(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k, block_table, cache_leftpad,
                    &args);
  args.kv_cache.k_new = to_view(k_new, "k_new");
  args.kv_cache.v_new = to_view(v_new, "v_new");
  args.kv_cache.rotary_cos = to_view(rotary_cos, "rotary_cos");
  args.kv_cache.rotary_sin = to_view(rotary_sin, "rotary_sin");
  args.kv_cache.rotary_interleaved = rotary_interleaved;
  args.sinks = to_view(sinks, "sinks");
  args.attn_probs = to_view(attn_probs, "attn_probs");
  PythonWorkspace scratch(workspace);
  Status status;
  {
    nb::gil_scoped_release release;
    status = cuflash::attention_forward(args, options, to_context(stream, scratch));
  }
  if (!status.ok()) raise_status(status);
}

void backward(const Array& dout, const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
              const Array& dq, const Array& dk, const Array& dv, const AttentionOptions& shared_options,
              std::uintptr_t stream, nb::handle workspace, const OptArray& alibi_slopes, const OptArray& cu_seqlens_q,
              const OptArray& cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, const OptArray& seqlens_k,
              const OptArray& block_table, const OptArray& sinks, const OptArray& dsinks, std::uint64_t dropout_seed,
              std::uint64_t dropout_offset, const OptArray& cache_leftpad) {
  const AttentionOptions options = with_dropout_rng(shared_options, dropout_seed, dropout_offset);
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
  set_batch_indices(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqlens_k, block_table, cache_leftpad,
                    &args);
  args.sinks = to_view(sinks, "sinks");
  args.dsinks = to_view(dsinks, "dsinks");
  PythonWorkspace scratch(workspace);
  Status status;
  {
    nb::gil_scoped_release release;
    status = cuflash::attention_backward(args, options, to_context(stream, scratch));
  }
  if (!status.ok()) raise_status(status);
}

void merge_states(const Array& out_a, const Array& lse_a, const Array& out_b, const Array& lse_b, const Array& out,
                  const Array& lse, const std::string& backend, std::uintptr_t stream) {
  cuflash::MergeArgs args;
  args.out_a = to_view(out_a, "out_a");
  args.lse_a = to_view(lse_a, "lse_a");
  args.out_b = to_view(out_b, "out_b");
  args.lse_b = to_view(lse_b, "lse_b");
  args.out = to_view(out, "out");
  args.lse = to_view(lse, "lse");
  const Backend chosen = to_backend(backend);
  PythonWorkspace scratch(nb::none());
  Status status;
  {
    nb::gil_scoped_release release;
    status = cuflash::merge_states(args, chosen, to_context(stream, scratch));
  }
  if (!status.ok()) raise_status(status);
}

bool backend_available(const std::string& name) { return cuflash::backend_available(to_backend(name)); }

// Linear attention (include/cuflash/linear_attention.hpp).
cuflash::FeatureMap to_feature_map(const std::string& name) {
  if (name == "identity") return cuflash::FeatureMap::identity;
  // "elu": flash-linear-attention's name for elu(x) + 1.
  if (name == "elu+1" || name == "elu") return cuflash::FeatureMap::elu_plus_one;
  if (name == "relu") return cuflash::FeatureMap::relu;
  throw InvalidArgument("feature_map: expected 'identity', 'elu+1' (or 'elu', flash-linear-attention's name for it) "
                        "or 'relu', got '" + name + "'");
}

cuflash::LinearAttentionOptions make_linear_options(std::optional<double> scale, bool causal,
                                                    const std::string& feature_map, bool normalize,
                                                    bool check_index_contents, const std::string& backend) {
  cuflash::LinearAttentionOptions options;
  if (scale) options.scale = static_cast<float>(*scale);
  options.causal = causal;
  options.feature_map = to_feature_map(feature_map);
  options.normalize = normalize;
  options.check_index_contents = check_index_contents;
  options.backend = to_backend(backend);
  return options;
}

// Runs one linear-attention call with the GIL released.
template <typename Call>
void run_linear(std::uintptr_t stream, Call call) {
  PythonWorkspace scratch(nb::none());
  Status status;
  {
    nb::gil_scoped_release release;
    status = call(to_context(stream, scratch));
  }
  if (!status.ok()) raise_status(status);
}

void linear_forward(const Array& q, const Array& k, const Array& v, const Array& out,
                    const cuflash::LinearAttentionOptions& options, std::uintptr_t stream, const OptArray& cu_seqlens,
                    const OptArray& initial_state, const OptArray& initial_key_sum, const OptArray& final_state,
                    const OptArray& final_key_sum) {
  cuflash::LinearForwardArgs args;
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.out = to_view(out, "out");
  args.cu_seqlens = to_view(cu_seqlens, "cu_seqlens");
  args.initial_state = to_view(initial_state, "initial_state");
  args.initial_key_sum = to_view(initial_key_sum, "initial_key_sum");
  args.final_state = to_view(final_state, "final_state");
  args.final_key_sum = to_view(final_key_sum, "final_key_sum");
  run_linear(stream, [&](const cuflash::RunContext& context) {
    return cuflash::linear_attention_forward(args, options, context);
  });
}

void linear_backward(const Array& dout, const Array& q, const Array& k, const Array& v, const Array& dq,
                     const Array& dk, const Array& dv, const cuflash::LinearAttentionOptions& options,
                     std::uintptr_t stream, const OptArray& cu_seqlens, const OptArray& initial_state,
                     const OptArray& initial_key_sum, const OptArray& dfinal_state, const OptArray& dfinal_key_sum,
                     const OptArray& dinitial_state, const OptArray& dinitial_key_sum) {
  cuflash::LinearBackwardArgs args;
  args.dout = to_view(dout, "dout");
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.dq = to_view(dq, "dq");
  args.dk = to_view(dk, "dk");
  args.dv = to_view(dv, "dv");
  args.cu_seqlens = to_view(cu_seqlens, "cu_seqlens");
  args.initial_state = to_view(initial_state, "initial_state");
  args.initial_key_sum = to_view(initial_key_sum, "initial_key_sum");
  args.dfinal_state = to_view(dfinal_state, "dfinal_state");
  args.dfinal_key_sum = to_view(dfinal_key_sum, "dfinal_key_sum");
  args.dinitial_state = to_view(dinitial_state, "dinitial_state");
  args.dinitial_key_sum = to_view(dinitial_key_sum, "dinitial_key_sum");
  run_linear(stream, [&](const cuflash::RunContext& context) {
    return cuflash::linear_attention_backward(args, options, context);
  });
}

void linear_step(const Array& q, const Array& k, const Array& v, const Array& out, const Array& state,
                 const cuflash::LinearAttentionOptions& options, std::uintptr_t stream, const OptArray& key_sum,
                 const OptArray& state_out, const OptArray& key_sum_out) {
  cuflash::LinearStepArgs args;
  args.q = to_view(q, "q");
  args.k = to_view(k, "k");
  args.v = to_view(v, "v");
  args.out = to_view(out, "out");
  args.state = to_view(state, "state");
  args.key_sum = to_view(key_sum, "key_sum");
  args.state_out = to_view(state_out, "state_out");
  args.key_sum_out = to_view(key_sum_out, "key_sum_out");
  run_linear(stream, [&](const cuflash::RunContext& context) {
    return cuflash::linear_attention_step(args, options, context);
  });
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "cuflash's C++ API on DLPack tensors (the Python layer in cuflash/ allocates the outputs)";

  // Bad input: a ValueError that is also a RuntimeError, as flash-attn raises
  // RuntimeError for what we call bad input and code catches either.
  static PyObject* invalid_argument_error = [] {
    nb::object bases = nb::make_tuple(nb::handle(PyExc_ValueError), nb::handle(PyExc_RuntimeError));
    return PyErr_NewExceptionWithDoc("cuflash.InvalidArgumentError",
                                     "Bad input to a cuflash call; both a ValueError and a RuntimeError.",
                                     bases.ptr(), nullptr);
  }();
  m.attr("InvalidArgumentError") = nb::handle(invalid_argument_error);
  nb::register_exception_translator([](const std::exception_ptr& pointer, void*) {
    try {
      std::rethrow_exception(pointer);
    } catch (const InvalidArgument& error) {
      PyErr_SetString(invalid_argument_error, error.what());
    } catch (const Unsupported& error) {
      PyErr_SetString(PyExc_NotImplementedError, error.what());
    } catch (const LibraryError& error) {
      PyErr_SetString(PyExc_RuntimeError, error.what());
    }
  });

  m.def("version", &cuflash::version, "The library's version, e.g. '0.1.0'.");
  m.def("backend_available", &backend_available, "backend"_a,
        "Whether a backend ('auto', 'cpu', 'cuda', 'cudnn') is compiled in and usable here now.");

  nb::class_<AttentionOptions>(m, "Options", "cuflash::AttentionOptions: the options of a call, built once and reused.")
      .def("__init__",
           [](AttentionOptions* self, std::optional<double> softmax_scale, bool causal, int window_left,
              int window_right, double softcap, bool deterministic, bool check_index_contents,
              const std::string& backend, double dropout_p) {
             new (self) AttentionOptions(make_options(softmax_scale, causal, window_left, window_right, softcap,
                                                      deterministic, check_index_contents, backend, dropout_p));
           },
           "softmax_scale"_a.none(), "causal"_a, "window_left"_a, "window_right"_a, "softcap"_a, "deterministic"_a,
           "check_index_contents"_a, "backend"_a, "dropout_p"_a = 0.0)
      .def(
          "with_diagonal_offset",
          [](const AttentionOptions& self, std::optional<std::int64_t> offset) {
            AttentionOptions copy = self;
            copy.diagonal_offset = offset;
            return copy;
          },
          "diagonal_offset"_a.none(),
          "A copy whose diagonal_offset is this (key j aligned with query i when j = i + offset; None: the "
          "bottom-right default).");

  m.def("ring_step_calls", &ring_step_calls, "layout"_a, "world_size"_a, "rank"_a, "kv_rank"_a, "causal"_a,
        "window_left"_a, "window_right"_a, "alibi"_a, "varlen"_a, "chunk_len"_a,
        "cuflash::ring_step_calls: the local calls of the ring step where `rank` holds the K/V block of `kv_rank`, "
        "as tuples (q_first, q_count, k_first, k_count, causal, window_left, window_right, diagonal_offset or None) "
        "in chunks (include/cuflash/ring_schedule.hpp).");

  m.def("forward", &forward, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "options"_a, "stream"_a,
        "workspace"_a.none(), "alibi_slopes"_a.none() = nb::none(), "cu_seqlens_q"_a.none() = nb::none(),
        "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0, "max_seqlen_k"_a = 0,
        "seqlens_k"_a.none() = nb::none(), "block_table"_a.none() = nb::none(), "k_new"_a.none() = nb::none(),
        "v_new"_a.none() = nb::none(), "sinks"_a.none() = nb::none(), "attn_probs"_a.none() = nb::none(),
        "dropout_seed"_a = 0, "dropout_offset"_a = 0, "cache_leftpad"_a.none() = nb::none(),
        "rotary_cos"_a.none() = nb::none(), "rotary_sin"_a.none() = nb::none(), "rotary_interleaved"_a = false,
        "cuflash::attention_forward on views of the given arrays; writes out (and lse, attn_probs, and the cache on "
        "append).");
  m.def("backward", &backward, "dout"_a, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a, "dq"_a, "dk"_a, "dv"_a, "options"_a,
        "stream"_a, "workspace"_a.none(), "alibi_slopes"_a.none() = nb::none(),
        "cu_seqlens_q"_a.none() = nb::none(), "cu_seqlens_k"_a.none() = nb::none(), "max_seqlen_q"_a = 0,
        "max_seqlen_k"_a = 0, "seqlens_k"_a.none() = nb::none(), "block_table"_a.none() = nb::none(),
        "sinks"_a.none() = nb::none(), "dsinks"_a.none() = nb::none(), "dropout_seed"_a = 0, "dropout_offset"_a = 0,
        "cache_leftpad"_a.none() = nb::none(),
        "cuflash::attention_backward on views of the given arrays; writes dq, dk, dv (and dsinks).");
  nb::class_<cuflash::LinearAttentionOptions>(m, "LinearOptions",
                                              "cuflash::LinearAttentionOptions: a linear-attention call's options.")
      .def("__init__",
           [](cuflash::LinearAttentionOptions* self, std::optional<double> scale, bool causal,
              const std::string& feature_map, bool normalize, bool check_index_contents, const std::string& backend) {
             new (self) cuflash::LinearAttentionOptions(
                 make_linear_options(scale, causal, feature_map, normalize, check_index_contents, backend));
           },
           "scale"_a.none(), "causal"_a, "feature_map"_a, "normalize"_a, "check_index_contents"_a, "backend"_a);

  m.def("linear_forward", &linear_forward, "q"_a, "k"_a, "v"_a, "out"_a, "options"_a, "stream"_a,
        "cu_seqlens"_a.none() = nb::none(), "initial_state"_a.none() = nb::none(),
        "initial_key_sum"_a.none() = nb::none(), "final_state"_a.none() = nb::none(),
        "final_key_sum"_a.none() = nb::none(),
        "cuflash::linear_attention_forward on views of the given arrays; writes out (and the final state).");
  m.def("linear_backward", &linear_backward, "dout"_a, "q"_a, "k"_a, "v"_a, "dq"_a, "dk"_a, "dv"_a, "options"_a,
        "stream"_a, "cu_seqlens"_a.none() = nb::none(), "initial_state"_a.none() = nb::none(),
        "initial_key_sum"_a.none() = nb::none(), "dfinal_state"_a.none() = nb::none(),
        "dfinal_key_sum"_a.none() = nb::none(), "dinitial_state"_a.none() = nb::none(),
        "dinitial_key_sum"_a.none() = nb::none(),
        "cuflash::linear_attention_backward on views of the given arrays; writes dq, dk, dv (and the initial "
        "state's gradients).");
  m.def("linear_step", &linear_step, "q"_a, "k"_a, "v"_a, "out"_a, "state"_a, "options"_a, "stream"_a,
        "key_sum"_a.none() = nb::none(), "state_out"_a.none() = nb::none(), "key_sum_out"_a.none() = nb::none(),
        "cuflash::linear_attention_step on views of the given arrays; writes out and the new state (in place "
        "without state_out).");

  m.def("merge_states", &merge_states, "out_a"_a, "lse_a"_a, "out_b"_a, "lse_b"_a, "out"_a, "lse"_a, "backend"_a,
        "stream"_a, "cuflash::merge_states on views of the given arrays; writes out and lse.");
}
