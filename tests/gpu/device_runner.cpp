#include "device_runner.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace cuflash::test {
namespace {

// Guard bytes before and after every tensor; 256 keeps cudaMalloc's
// alignment. CUFLASH_TEST_NO_GUARDS=1 (scripts/gpu-check.sh sets it under
// compute-sanitizer) drops them: every tensor is then exactly its own
// allocation, so that memcheck also flags a read just past its end.
std::size_t guard_bytes() {
  static const std::size_t bytes = [] {
    const char* env = std::getenv("CUFLASH_TEST_NO_GUARDS");
    return env != nullptr && *env != '\0' && std::string(env) != "0" ? std::size_t{0} : std::size_t{256};
  }();
  return bytes;
}
constexpr unsigned char kGuardPattern = 0xA5;
// Workspace bytes: 0xFFFFFFFF is a float NaN, so a backend that relies on
// zeroed scratch shows.
constexpr int kWorkspacePattern = 0xFF;

Status harness_error(cudaError_t error, const char* what) {
  return {StatusCode::cuda_error, std::string("test harness: ") + what + ": " + cudaGetErrorName(error) + " (" +
                                      cudaGetErrorString(error) + ")"};
}

#define HARNESS_TRY(call)                                                           \
  do {                                                                              \
    const cudaError_t harness_error_ = (call);                                      \
    if (harness_error_ != cudaSuccess) return harness_error(harness_error_, #call); \
  } while (0)

// One cudaMalloc'd block, freed on scope exit.
class DeviceBlock {
 public:
  DeviceBlock() = default;
  ~DeviceBlock() {
    if (pointer_ != nullptr) {
      EXPECT_EQ(cudaFree(pointer_), cudaSuccess) << "test harness: cudaFree";
    }
  }
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;

  Status allocate(std::size_t bytes) {
    HARNESS_TRY(cudaMalloc(&pointer_, std::max<std::size_t>(bytes, 1)));
    return {};
  }
  std::byte* get() const { return static_cast<std::byte*>(pointer_); }

 private:
  void* pointer_ = nullptr;
};

// A host tensor's device twin: [guard + misalign][the tensor's bytes][guard].
struct Twin {
  HostTensor* host = nullptr;
  const char* name = "";
  DeviceBlock block;
  std::size_t front = 0;  // bytes before the tensor
  std::byte* data() const { return block.get() + front; }
};

class DeviceMirror {
 public:
  DeviceMirror(std::size_t misalign, std::string misalign_only)
      : misalign_(misalign), misalign_only_(std::move(misalign_only)) {}

  // Copies a non-empty tensor to the device, guards around it.
  Status add(HostTensor& tensor, const char* name) {
    if (tensor.empty()) return {};
    auto twin = std::make_unique<Twin>();
    twin->host = &tensor;
    twin->name = name;
    twin->front = guard_bytes() + (misalign_only_.empty() || misalign_only_ == name ? misalign_ : 0);
    const std::size_t bytes = tensor.bytes().size();
    CUFLASH_TRY(twin->block.allocate(twin->front + bytes + guard_bytes()));
    HARNESS_TRY(
        cudaMemset(twin->block.get(), kGuardPattern, std::max<std::size_t>(twin->front + bytes + guard_bytes(), 1)));
    if (bytes > 0) HARNESS_TRY(cudaMemcpy(twin->data(), tensor.bytes().data(), bytes, cudaMemcpyHostToDevice));
    twins_.push_back(std::move(twin));
    return {};
  }

  // A view of a host tensor (as AttentionCase::forward_args builds it) made
  // into the same view of that tensor's device twin.
  Status translate(TensorView* view, const char* field) const {
    if (view->empty()) return {};
    const auto* address = static_cast<const std::byte*>(view->data);
    for (const auto& twin : twins_) {
      const std::byte* begin = twin->host->bytes().data();
      const std::size_t size = twin->host->bytes().size();
      if (address == begin || (address > begin && address < begin + size)) {
        view->data = twin->data() + (address - begin);
        view->device = Device::cuda(0);
        return {};
      }
    }
    return {StatusCode::internal, std::string("test harness: argument ") + field + " is no tensor of the case"};
  }

  // Every tensor back into its host bytes, on `stream`, then waits for it.
  Status copy_back(cudaStream_t stream) {
    for (const auto& twin : twins_) {
      const std::size_t bytes = twin->host->bytes().size();
      if (bytes > 0)
        HARNESS_TRY(cudaMemcpyAsync(twin->host->bytes().data(), twin->data(), bytes, cudaMemcpyDeviceToHost, stream));
    }
    HARNESS_TRY(cudaStreamSynchronize(stream));
    return {};
  }

  // Adds a failure for every tensor whose guard bytes changed.
  Status expect_guards_intact() const {
    if (guard_bytes() == 0) return {};
    for (const auto& twin : twins_) {
      const std::size_t bytes = twin->host->bytes().size();
      std::vector<unsigned char> front(twin->front), back(guard_bytes());
      HARNESS_TRY(cudaMemcpy(front.data(), twin->block.get(), front.size(), cudaMemcpyDeviceToHost));
      HARNESS_TRY(cudaMemcpy(back.data(), twin->data() + bytes, back.size(), cudaMemcpyDeviceToHost));
      const auto changed = [](const std::vector<unsigned char>& guard) {
        return std::count_if(guard.begin(), guard.end(), [](unsigned char b) { return b != kGuardPattern; });
      };
      EXPECT_EQ(changed(front), 0) << "bytes before " << twin->name << " were written (out-of-bounds write)";
      EXPECT_EQ(changed(back), 0) << "bytes after " << twin->name << " were written (out-of-bounds write)";
    }
    return {};
  }

 private:
  std::size_t misalign_;
  std::string misalign_only_;
  std::vector<std::unique_ptr<Twin>> twins_;
};

Status add_case(DeviceMirror& mirror, AttentionCase& c) {
  const std::pair<HostTensor*, const char*> tensors[] = {
      {&c.q, "q"},
      {&c.k, "k"},
      {&c.v, "v"},
      {&c.out, "out"},
      {&c.lse, "lse"},
      {&c.dout, "dout"},
      {&c.dq, "dq"},
      {&c.dk, "dk"},
      {&c.dv, "dv"},
      {&c.alibi, "alibi_slopes"},
      {&c.cu_seqlens_q, "cu_seqlens_q"},
      {&c.cu_seqlens_k, "cu_seqlens_k"},
      {&c.seqlens_k, "seqlens_k"},
      {&c.block_table, "block_table"},
      {&c.k_new, "k_new"},
      {&c.v_new, "v_new"},
  };
  for (const auto& [tensor, name] : tensors) CUFLASH_TRY(mirror.add(*tensor, name));
  return {};
}

template <typename Args>
Status translate_shared(const DeviceMirror& m, Args& a) {
  CUFLASH_TRY(m.translate(&a.q, "q"));
  CUFLASH_TRY(m.translate(&a.k, "k"));
  CUFLASH_TRY(m.translate(&a.v, "v"));
  CUFLASH_TRY(m.translate(&a.out, "out"));
  CUFLASH_TRY(m.translate(&a.lse, "lse"));
  CUFLASH_TRY(m.translate(&a.alibi_slopes, "alibi_slopes"));
  CUFLASH_TRY(m.translate(&a.varlen.cu_seqlens_q, "varlen.cu_seqlens_q"));
  CUFLASH_TRY(m.translate(&a.varlen.cu_seqlens_k, "varlen.cu_seqlens_k"));
  CUFLASH_TRY(m.translate(&a.kv_cache.seqlens_k, "kv_cache.seqlens_k"));
  CUFLASH_TRY(m.translate(&a.kv_cache.block_table, "kv_cache.block_table"));
  CUFLASH_TRY(m.translate(&a.kv_cache.k_new, "kv_cache.k_new"));
  CUFLASH_TRY(m.translate(&a.kv_cache.v_new, "kv_cache.v_new"));
  return {};
}

Status translate_args(const DeviceMirror& m, ForwardArgs& a) { return translate_shared(m, a); }

Status translate_args(const DeviceMirror& m, BackwardArgs& a) {
  CUFLASH_TRY(translate_shared(m, a));
  CUFLASH_TRY(m.translate(&a.dout, "dout"));
  CUFLASH_TRY(m.translate(&a.dq, "dq"));
  CUFLASH_TRY(m.translate(&a.dk, "dk"));
  CUFLASH_TRY(m.translate(&a.dv, "dv"));
  return {};
}

}  // namespace

DeviceRunner::DeviceRunner(Backend backend) : backend_(backend) {
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess)
      << "test harness: cudaStreamCreateWithFlags";
  stream_ = stream;
}

DeviceRunner::~DeviceRunner() {
  if (stream_ != nullptr) {
    EXPECT_EQ(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)), cudaSuccess) << "test harness: cudaStreamDestroy";
  }
}

template <typename Args, typename Query, typename Call>
Status DeviceRunner::run(AttentionCase& c, Args args, Query query, Call call) {
  DeviceMirror mirror(misalign_bytes, misalign_only);
  CUFLASH_TRY(add_case(mirror, c));
  CUFLASH_TRY(translate_args(mirror, args));
  // cudaMemset and pageable cudaMemcpy may still be in flight on return;
  // the call below runs on another (non-blocking) stream.
  HARNESS_TRY(cudaDeviceSynchronize());

  const auto stream = default_stream ? cudaStream_t{} : static_cast<cudaStream_t>(stream_);
  last_workspace_bytes = 0;
  last_workspace_status = query(args, &last_workspace_bytes);
  RunContext context;
  context.stream = stream;
  DeviceBlock workspace;
  if (last_workspace_status.ok() && last_workspace_bytes > 0 && workspace_mode != WorkspaceMode::none) {
    const std::size_t given = last_workspace_bytes - (workspace_mode == WorkspaceMode::too_small ? 1 : 0);
    CUFLASH_TRY(workspace.allocate(given));
    HARNESS_TRY(cudaMemset(workspace.get(), kWorkspacePattern, std::max<std::size_t>(given, 1)));
    HARNESS_TRY(cudaDeviceSynchronize());
    context.workspace = workspace.get();
    context.workspace_bytes = given;
  }

  const Status status = call(args, context);

  // The size query and the call validate the same arguments: they must agree.
  if (!last_workspace_status.ok() && status.ok())
    ADD_FAILURE() << "the workspace query failed (" << last_workspace_status.to_string() << ") but the call ran";
  if (!last_workspace_status.ok() && !status.ok() && last_workspace_status.code() != status.code())
    ADD_FAILURE() << "the workspace query answered " << last_workspace_status.to_string() << ", the call "
                  << status.to_string();
  if (last_workspace_status.ok() && status.code() == StatusCode::unsupported)
    ADD_FAILURE() << "the workspace query accepted the call, which then answered " << status.to_string();

  // Waiting on the call's stream only (then copying on it): a kernel launched
  // on another stream would race with the copies and show as poison.
  HARNESS_TRY(cudaStreamSynchronize(stream));
  CUFLASH_TRY(mirror.copy_back(stream));
  HARNESS_TRY(cudaDeviceSynchronize());
  HARNESS_TRY(cudaGetLastError());
  CUFLASH_TRY(mirror.expect_guards_intact());
  return status;
}

Status DeviceRunner::forward(AttentionCase& c, const AttentionOptions& options) {
  return run(
      c, c.forward_args(),
      [&](const ForwardArgs& a, std::size_t* bytes) { return forward_workspace_size(a, options, bytes); },
      [&](const ForwardArgs& a, const RunContext& context) { return attention_forward(a, options, context); });
}

Status DeviceRunner::backward(AttentionCase& c, const AttentionOptions& options) {
  return run(
      c, c.backward_args(),
      [&](const BackwardArgs& a, std::size_t* bytes) { return backward_workspace_size(a, options, bytes); },
      [&](const BackwardArgs& a, const RunContext& context) { return attention_backward(a, options, context); });
}

MaxAbsBound gpu_max_abs_bound(DType dtype) {
  switch (dtype) {
    case DType::f16:
      return {1e-2, 1e-2};
    case DType::bf16:
      return {5e-2, 5e-2};
    default:
      return {1e-5, 1e-4};  // out: as default_tolerance already checks
  }
}

namespace {

void expect_max_abs_of(const ErrorStats& e, double bound, DType dtype, const char* name, const char* quantity) {
  if (e.compared == 0 || e.mismatches > 0 || !(e.ref_max_abs > 0.0)) return;  // already failed, or nothing to scale by
  const double ratio = e.max_abs / e.ref_max_abs;
  EXPECT_LE(ratio, bound) << name << ": max |got - ref| / max |ref| = " << ratio << " over " << bound << "; "
                          << e.describe();
  record_error(dtype, quantity, ratio);
}

}  // namespace

void expect_max_abs(const ForwardErrors& errors, DType dtype) {
  if (dtype == DType::f32) return;  // default_tolerance bounds f32 out by max-abs already
  expect_max_abs_of(errors.out, gpu_max_abs_bound(dtype).out, dtype, "out", "out max_abs/scale");
}

void expect_max_abs(const BackwardErrors& errors, DType dtype) {
  const double bound = gpu_max_abs_bound(dtype).grad;
  expect_max_abs_of(errors.dq, bound, dtype, "dq", "dq max_abs/scale");
  expect_max_abs_of(errors.dk, bound, dtype, "dk", "dk max_abs/scale");
  expect_max_abs_of(errors.dv, bound, dtype, "dv", "dv max_abs/scale");
}

ForwardErrors check_forward_gpu(AttentionCase& c, Runner& runner) {
  const ForwardErrors errors = check_forward(c, runner);
  expect_max_abs(errors, c.spec().dtype);
  return errors;
}

BackwardErrors check_backward_gpu(AttentionCase& c, Runner& runner) {
  const BackwardErrors errors = check_backward(c, runner);
  expect_max_abs(errors, c.spec().dtype);
  return errors;
}

}  // namespace cuflash::test
