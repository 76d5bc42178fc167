// The cuda backend's forward plan: which kernel runs a problem (the sm80
// mma.sync kernel, the cp.async wgmma kernel or the warp-specialized TMA
// kernel), the tile the split rule sizes by, the split-KV count, the TMA
// kernel's walk (persistent CTAs, causal pairs) and the workspace, decided
// once per call from the problem and the device; the workspace query and
// the launch read the same plan. Environment overrides (CUFLASH_SM90_FORWARD,
// CUFLASH_SM90_TMA, CUFLASH_TMA_PERSISTENT, CUFLASH_FORWARD_SPLITS) are read
// once per process.
#pragma once

#include <cstddef>

#include "common/device_info.hpp"
#include "problem.hpp"
#include "sm80/flash_fwd_tiles.hpp"
#include "sm90/flash_fwd_tma_launch_args.hpp"

namespace cuflash::detail {

enum class ForwardKind { sm80, wgmma, tma };

struct ForwardPlan {
  ForwardKind kind = ForwardKind::sm80;
  sm80::FwdTile tile{};           // the CTA tile (query rows, keys) the splits are sized by
  int splits = 1;                 // split-KV count (1: none)
  sm90::TmaForwardLaunch tma{};   // kind == tma: the tensors its maps encode, the walk
  std::size_t workspace_bytes = 0;  // the split partials
};

// The plan on `device` (a test may pass any DeviceInfo); the second form
// reads the problem's device.
ForwardPlan plan_forward(const Problem& problem, const DeviceInfo& device);
ForwardPlan plan_forward(const Problem& problem);

}  // namespace cuflash::detail
