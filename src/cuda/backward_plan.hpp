// The cuda backend's backward plan: which kernel runs a problem (the sm80
// mma.sync kernels or the warp-specialized TMA kernel on Hopper), the
// tensors the TMA kernel's maps encode, and the workspace, decided once per
// call from the problem and the device; the workspace query and the launch
// read the same plan. CUFLASH_SM90_BACKWARD=0 keeps Hopper on the sm80
// kernels (read once per process).
#pragma once

#include <cstddef>

#include "common/device_info.hpp"
#include "problem.hpp"
#include "sm90/flash_bwd_tma_launch_args.hpp"

namespace cuflash::detail {

enum class BackwardKind { sm80, tma };

struct BackwardPlan {
  BackwardKind kind = BackwardKind::sm80;
  sm90::TmaBackwardLaunch tma{};  // kind == tma: the tensors its maps encode
  std::size_t workspace_bytes = 0;
};

// The plan on `device` (a test may pass any DeviceInfo); the second form
// reads the problem's device.
BackwardPlan plan_backward(const Problem& problem, const DeviceInfo& device);
BackwardPlan plan_backward(const Problem& problem);

}  // namespace cuflash::detail
