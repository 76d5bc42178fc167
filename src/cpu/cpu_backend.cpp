// The CPU backend: the exact reference that the GPU backends are tested
// against. Host memory only (dispatch checks placement); any head_dim up to 256.
#include <exception>
#include <new>
#include <string>

#include "backend.hpp"
#include "cpu_kernels.hpp"

namespace cuflash::detail {
namespace {

constexpr int kMaxHeadDim = 256;

// Scratch allocation is the only thing that can fail once a problem is valid.
template <typename Pass>
Status run_guarded(const char* what, Pass&& pass) {
  try {
    pass();
    return Status::success();
  } catch (const std::bad_alloc&) {
    return {StatusCode::internal, std::string("backend cpu: out of host memory for the ") + what + " scratch"};
  } catch (const std::exception& error) {
    return {StatusCode::internal, std::string("backend cpu: ") + what + ": " + error.what()};
  }
}

class CpuBackend final : public BackendImpl {
 public:
  Backend kind() const override { return Backend::cpu; }
  bool available() const override { return true; }

  Status supports(const Problem& problem) const override {
    if (problem.head_dim > kMaxHeadDim)
      return Status::unsupported("head_dim: backend cpu supports 1.." + std::to_string(kMaxHeadDim) + ", got " +
                                 std::to_string(problem.head_dim));
    if (problem.layout != Layout::dense && !problem.host_indices_valid)
      return Status::unsupported("backend cpu needs the index tensors' contents on the host "
                                 "(check_index_contents was off for GPU-resident indices)");
    return Status::success();
  }

  Status supports_merge(const MergeProblem&) const override { return Status::success(); }

  Status workspace_size(const Problem&, std::size_t* bytes) const override {
    *bytes = 0;
    return Status::success();
  }

  Status forward(const Problem& problem, const RunContext&) override {
    return run_guarded("forward", [&] { cpu::run_forward(problem); });
  }

  Status backward(const Problem& problem, const RunContext&) override {
    return run_guarded("backward", [&] { cpu::run_backward(problem); });
  }

  Status merge_states(const MergeProblem& problem, const RunContext&) override {
    return run_guarded("merge_states", [&] { cpu::run_merge(problem); });
  }

  // Any key_dim and value_dim: the state is a (Dk x Dv) float array per work item.
  Status supports_linear(const LinearProblem& problem) const override {
    if (problem.varlen && !problem.host_indices_valid)
      return Status::unsupported("backend cpu needs the contents of cu_seqlens on the host "
                                 "(check_index_contents was off for a GPU-resident cu_seqlens)");
    return Status::success();
  }

  Status linear_forward(const LinearProblem& problem, const RunContext&) override {
    CUFLASH_TRY(supports_linear(problem));
    return run_guarded("linear attention forward", [&] { cpu::run_linear_forward(problem); });
  }

  Status linear_backward(const LinearProblem& problem, const RunContext&) override {
    CUFLASH_TRY(supports_linear(problem));
    return run_guarded("linear attention backward", [&] { cpu::run_linear_backward(problem); });
  }
};

}  // namespace

BackendImpl* cpu_backend() {
  static CpuBackend backend;
  return &backend;
}

}  // namespace cuflash::detail
