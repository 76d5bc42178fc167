// backend=cuda: cuflash's own kernels. This build has merge_states; the
// FlashAttention-2 forward/backward kernels (issue 3) and the paged/decode
// kernels (issue 5) plug in behind `supports` and `forward`/`backward`.
#include <cuda_runtime_api.h>

#include "backend.hpp"
#include "common/cuda_check.hpp"
#include "sm80/merge_states.cuh"

namespace cuflash::detail {

namespace {

class CudaBackend final : public BackendImpl {
 public:
  Backend kind() const override { return Backend::cuda; }

  bool available() const override {
    static const bool has_gpu = [] {
      int count = 0;
      return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    }();
    return has_gpu;
  }

  Status supports(const Problem&) const override {
    return Status::unsupported("backend cuda: attention kernels are not built yet (planned: FlashAttention-2 on sm80+)");
  }
  Status supports_merge(const MergeProblem&) const override { return {}; }
  Status workspace_size(const Problem&, std::size_t* bytes) const override {
    *bytes = 0;
    return {};
  }
  Status forward(const Problem& problem, const RunContext&) override { return supports(problem); }
  Status backward(const Problem& problem, const RunContext&) override { return supports(problem); }

  Status merge_states(const MergeProblem& problem, const RunContext& context) override {
    DeviceGuard guard(problem.device.index);
    CUFLASH_TRY(guard.status());
    return launch_merge_states(problem, static_cast<cudaStream_t>(context.stream));
  }
};

}  // namespace

BackendImpl* cuda_backend() {
  static CudaBackend backend;
  return &backend;
}

}  // namespace cuflash::detail
