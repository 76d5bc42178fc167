#include "device_runner.hpp"

#include "gpu_cases.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cmath>
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
      {&c.sinks, "sinks"},
      {&c.dsinks, "dsinks"},
      {&c.cu_seqlens_q, "cu_seqlens_q"},
      {&c.cu_seqlens_k, "cu_seqlens_k"},
      {&c.seqlens_k, "seqlens_k"},
      {&c.block_table, "block_table"},
      {&c.k_new, "k_new"},
      {&c.v_new, "v_new"},
      {&c.leftpad, "leftpad"},
      {&c.rotary_cos, "rotary_cos"},
      {&c.rotary_sin, "rotary_sin"},
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
  CUFLASH_TRY(m.translate(&a.sinks, "sinks"));
  CUFLASH_TRY(m.translate(&a.varlen.cu_seqlens_q, "varlen.cu_seqlens_q"));
  CUFLASH_TRY(m.translate(&a.varlen.cu_seqlens_k, "varlen.cu_seqlens_k"));
  CUFLASH_TRY(m.translate(&a.kv_cache.seqlens_k, "kv_cache.seqlens_k"));
  CUFLASH_TRY(m.translate(&a.kv_cache.block_table, "kv_cache.block_table"));
  CUFLASH_TRY(m.translate(&a.kv_cache.k_new, "kv_cache.k_new"));
  CUFLASH_TRY(m.translate(&a.kv_cache.v_new, "kv_cache.v_new"));
  CUFLASH_TRY(m.translate(&a.kv_cache.leftpad, "kv_cache.leftpad"));
  CUFLASH_TRY(m.translate(&a.kv_cache.rotary_cos, "kv_cache.rotary_cos"));
  CUFLASH_TRY(m.translate(&a.kv_cache.rotary_sin, "kv_cache.rotary_sin"));
  return {};
}

Status translate_args(const DeviceMirror& m, ForwardArgs& a) { return translate_shared(m, a); }

Status translate_args(const DeviceMirror& m, BackwardArgs& a) {
  CUFLASH_TRY(translate_shared(m, a));
  CUFLASH_TRY(m.translate(&a.dout, "dout"));
  CUFLASH_TRY(m.translate(&a.dq, "dq"));
  CUFLASH_TRY(m.translate(&a.dk, "dk"));
  CUFLASH_TRY(m.translate(&a.dv, "dv"));
  CUFLASH_TRY(m.translate(&a.dsinks, "dsinks"));
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

void expect_max_abs_of(const ErrorStats& e, double bound, DType dtype, const char* name, const char* quantity,
                       Backend backend) {
  if (e.compared == 0 || e.mismatches > 0 || !(e.ref_max_abs > 0.0)) return;  // already failed, or nothing to scale by
  const double ratio = e.max_abs / e.ref_max_abs;
  EXPECT_LE(ratio, bound) << name << ": max |got - ref| / max |ref| = " << ratio << " over " << bound << "; "
                          << e.describe();
  record_error(dtype, quantity, ratio, backend);
}

}  // namespace

void expect_max_abs(const ForwardErrors& errors, DType dtype, Backend backend) {
  if (dtype == DType::f32) return;  // default_tolerance bounds f32 out by max-abs already
  expect_max_abs_of(errors.out, gpu_max_abs_bound(dtype).out, dtype, "out", "out max_abs/scale", backend);
}

void expect_max_abs(const BackwardErrors& errors, DType dtype, Backend backend) {
  const double bound = gpu_max_abs_bound(dtype).grad;
  expect_max_abs_of(errors.dq, bound, dtype, "dq", "dq max_abs/scale", backend);
  expect_max_abs_of(errors.dk, bound, dtype, "dk", "dk max_abs/scale", backend);
  expect_max_abs_of(errors.dv, bound, dtype, "dv", "dv max_abs/scale", backend);
}

ForwardErrors check_forward_gpu(AttentionCase& c, Runner& runner) {
  const ForwardErrors errors = check_forward(c, runner);
  expect_max_abs(errors, c.spec().dtype, runner.backend());
  return errors;
}

BackwardErrors check_backward_gpu(AttentionCase& c, Runner& runner) {
  const BackwardErrors errors = check_backward(c, runner);
  expect_max_abs(errors, c.spec().dtype, runner.backend());
  return errors;
}

// ----- checks the backends' suites share -----------------------------------------

const char* test_pass_name(TestPass pass) { return pass == TestPass::forward ? "forward" : "backward"; }

Status run_pass(DeviceRunner& runner, AttentionCase& c, TestPass pass, Backend backend) {
  return pass == TestPass::forward ? runner.forward(c, c.options(backend)) : runner.backward(c, c.options(backend));
}

void expect_case_unchanged(const AttentionCase& before, const AttentionCase& after) {
  const std::pair<const HostTensor AttentionCase::*, const char*> tensors[] = {
      {&AttentionCase::q, "q"},         {&AttentionCase::k, "k"},         {&AttentionCase::v, "v"},
      {&AttentionCase::out, "out"},     {&AttentionCase::lse, "lse"},     {&AttentionCase::dout, "dout"},
      {&AttentionCase::dq, "dq"},       {&AttentionCase::dk, "dk"},       {&AttentionCase::dv, "dv"},
      {&AttentionCase::k_new, "k_new"}, {&AttentionCase::v_new, "v_new"}, {&AttentionCase::alibi, "alibi"},
      {&AttentionCase::sinks, "sinks"}, {&AttentionCase::dsinks, "dsinks"}, {&AttentionCase::leftpad, "leftpad"},
      {&AttentionCase::rotary_cos, "rotary_cos"}, {&AttentionCase::rotary_sin, "rotary_sin"},
  };
  for (const auto& [member, name] : tensors)
    EXPECT_TRUE(same_bytes(before.*member, after.*member)) << name << " was written by a call that failed";
}

namespace {

std::string lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

}  // namespace

void expect_refused(AttentionCase& c, DeviceRunner& runner, TestPass pass, const std::vector<std::string>& must_mention,
                    Backend backend) {
  SCOPED_TRACE(test_pass_name(pass));
  const AttentionCase before = c;
  const Status status = run_pass(runner, c, pass, backend);
  EXPECT_EQ(status.code(), StatusCode::unsupported) << status.to_string();
  for (const std::string& word : must_mention)
    EXPECT_NE(lowercase(status.message()).find(lowercase(word)), std::string::npos)
        << "the message should mention \"" << word << "\": " << status.message();
  EXPECT_EQ(runner.last_workspace_status.code(), StatusCode::unsupported)
      << "workspace query: " << runner.last_workspace_status.to_string();
  expect_case_unchanged(before, c);
}

void expect_unowned_out_rows_untouched(const AttentionCase& c) {
  if (c.spec().layout != CaseLayout::varlen) return;
  const std::vector<bool> owned = c.q_rows_owned();
  std::int64_t written = 0;
  for (std::int64_t i = 0; i < c.out.numel(); ++i) written += !owned[i] && !std::isnan(c.out.get(i)) ? 1 : 0;
  EXPECT_EQ(written, 0) << "out elements after cu_seqlens_q[B] were written";
}

void check_masked_rows(DType dtype, Backend backend) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(dense_case("masked", 9, 4, 2, 1, 32, 1));  // offset -5: queries 0..4 see nothing
  s.dtype = dtype;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(backend);
  check_forward_gpu(c, runner);
  const std::int64_t row = 2 * 32;
  for (int i = 0; i < 9; ++i)
    for (int h = 0; h < 2; ++h) {
      const double lse = c.lse.get(h * 9 + i);
      if (i >= 5) {
        EXPECT_TRUE(std::isfinite(lse)) << "query " << i << " head " << h;
        continue;
      }
      EXPECT_EQ(lse, -INFINITY) << "query " << i << " head " << h;
      for (int d = 0; d < 32; ++d)
        EXPECT_EQ(c.out.get(i * row + h * 32 + d), 0.0) << "query " << i << " head " << h << " dim " << d;
    }
}

void check_deterministic_backward(CaseSpec spec, Backend backend) {
  CUFLASH_TEST_RNG(rng);
  spec.options.deterministic = true;
  AttentionCase c(spec, rng.engine());
  DeviceRunner runner(backend);
  check_backward_gpu(c, runner);
  if (::testing::Test::HasFailure()) return;
  expect_same_gradients_on_rerun(c, runner, c.options(backend));
}

void expect_same_gradients_on_rerun(AttentionCase& c, DeviceRunner& runner, const AttentionOptions& options) {
  const HostTensor dq = c.dq, dk = c.dk, dv = c.dv;
  c.dq.poison();
  c.dk.poison();
  c.dv.poison();
  const Status status = runner.backward(c, options);
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(same_bytes(dq, c.dq)) << "dq differs between two deterministic runs";
  EXPECT_TRUE(same_bytes(dk, c.dk)) << "dk differs between two deterministic runs";
  EXPECT_TRUE(same_bytes(dv, c.dv)) << "dv differs between two deterministic runs";
}

}  // namespace cuflash::test
