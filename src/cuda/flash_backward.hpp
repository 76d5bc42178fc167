// Host entry of the tensor-core backward (fp16/bf16): the sm80 mma.sync
// kernels, and on Hopper the warp-specialized TMA kernel (backward_plan.hpp
// picks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// ok, or `unsupported` with the reason (head dim, dtype, layout, alignment).
Status flash_backward_supports(const Problem& problem);
// Scratch bytes of the kernel the backward plan picks; depends on shapes and
// the device only.
std::size_t flash_backward_workspace_bytes(const Problem& problem);
Status flash_backward(const Problem& problem, void* workspace, cudaStream_t stream);

}  // namespace cuflash::detail
