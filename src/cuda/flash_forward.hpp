// Host entry of the tensor-core forward (fp16/bf16): the sm80 mma.sync
// kernel, and on Hopper the wgmma and TMA kernels (forward_plan.hpp picks).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// ok, or `unsupported` with the reason (head dim, dtype, layout, alignment).
Status flash_forward_supports(const Problem& problem);
// Scratch bytes (split-KV partial outputs); depends on shapes only.
std::size_t flash_forward_workspace_bytes(const Problem& problem);
Status flash_forward(const Problem& problem, void* workspace, cudaStream_t stream);

}  // namespace cuflash::detail
