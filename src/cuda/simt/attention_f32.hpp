// Host entry of the float32 path of backend=cuda: plain fp32 arithmetic on the
// CUDA cores (no tensor cores, no TF32), forward and backward.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

Status f32_attention_supports(const Problem& problem);
std::size_t f32_forward_workspace_bytes(const Problem& problem);
std::size_t f32_backward_workspace_bytes(const Problem& problem);
Status f32_forward(const Problem& problem, void* workspace, cudaStream_t stream);
Status f32_backward(const Problem& problem, void* workspace, cudaStream_t stream);

}  // namespace cuflash::detail
