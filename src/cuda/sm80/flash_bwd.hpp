// Host side of the FlashAttention-2 backward kernels (fp16/bf16, mma.sync,
// sm80+): what they support, their workspace and their launch. The cuda
// backend calls them through flash_backward.hpp, whose plan picks them or
// the Hopper TMA kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_params.hpp"
#include "common/device_info.hpp"
#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// ok, or `unsupported` with the reason (head dim, dtype, layout, alignment,
// shared memory, grid limits).
Status sm80_backward_supports(const Problem& problem);
// Scratch bytes of the sm80 kernels (dq accumulator, dot(dout, out)).
std::size_t sm80_backward_workspace_bytes(const Problem& problem);
// The sm80 kernels on `p` (made from `problem`), with their workspace.
Status sm80_backward(const Problem& problem, BackwardParams p, const DeviceInfo& info, void* workspace,
                     cudaStream_t stream);

}  // namespace cuflash::detail
