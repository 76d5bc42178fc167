// Host side of the tensor-core backward: what it supports, its workspace, and
// the launch of the kernel the plan (backward_plan.hpp: the sm80 kernels, or
// the TMA kernel on Hopper) picked, dispatched on dtype x head dim to the
// explicit instantiations in src/cuda/inst/flash_bwd_*.cu.
#include "flash_backward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "backward_plan.hpp"
#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/kernel_table.hpp"
#include "sm80/flash_bwd.hpp"

namespace cuflash::detail {

namespace sm90 {
template <typename T, int D>
Status launch_flash_bwd_tma(const BackwardParams& p, const TmaBackwardLaunch& launch, void* workspace,
                            cudaStream_t stream);
}  // namespace sm90

namespace {

template <typename T>
Status launch_tma_for_dim(const BackwardParams& p, const sm90::TmaBackwardLaunch& launch, int head_dim,
                          void* workspace, cudaStream_t stream) {
  return kernel_table::with_tma_backward_head_dim(
      head_dim,
      [&](auto d) { return sm90::launch_flash_bwd_tma<T, decltype(d)::value>(p, launch, workspace, stream); },
      [&] {
        return Status{StatusCode::internal, "backend cuda backward: no TMA kernel for head_dim " + std::to_string(head_dim)};
      });
}

}  // namespace

// The sm80 kernels run every call the backend accepts (the TMA kernel a
// subset of them), so their limits are the backward's.
Status flash_backward_supports(const Problem& problem) { return sm80_backward_supports(problem); }

std::size_t flash_backward_workspace_bytes(const Problem& problem) { return plan_backward(problem).workspace_bytes; }

Status flash_backward(const Problem& problem, void* workspace, cudaStream_t stream) {
  DeviceGuard guard(problem.device.index);
  CUFLASH_TRY(guard.status());
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid) return Status::unsupported("backend cuda backward: cannot query the GPU's properties");

  // Windows wider than a sequence are normalized per sequence on the device
  // (score_rules), which keeps the kernels' index arithmetic inside int.
  const BackwardParams p = make_backward_params(problem);
  const BackwardPlan plan = plan_backward(problem, info);
  if (plan.kind == BackwardKind::tma) {
    if (problem.dtype == DType::bf16)
      return launch_tma_for_dim<__nv_bfloat16>(p, plan.tma, problem.head_dim, workspace, stream);
    return launch_tma_for_dim<__half>(p, plan.tma, problem.head_dim, workspace, stream);
  }
  return sm80_backward(problem, p, info, workspace, stream);
}

}  // namespace cuflash::detail
