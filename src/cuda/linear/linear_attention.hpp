// Linear attention on backend cuda (docs/linear.md, "How it is computed"):
// what the backend's supports_linear / linear_forward / linear_backward call.
// f16/bf16 with Dk, Dv in {64, 128} run the chunked tensor-core kernels
// (linear_chunk_*.cuh); everything else valid (f32, other head dims, the
// decode step) the fp32 recurrence on CUDA cores (linear_simt.cuh).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "linear_problem.hpp"

namespace cuflash::detail {

// ok, or `unsupported` naming the argument backend cuda cannot take.
Status linear_cuda_supports(const LinearProblem& problem);
// Scratch the call needs (fp32 chunk states, or the SIMT backward's row gradients).
std::size_t linear_cuda_workspace_bytes(const LinearProblem& problem);
// Forward and decode step (LinearPass::step); `workspace` holds
// linear_cuda_workspace_bytes(problem) bytes.
Status linear_cuda_forward(const LinearProblem& problem, void* workspace, cudaStream_t stream);
Status linear_cuda_backward(const LinearProblem& problem, void* workspace, cudaStream_t stream);

}  // namespace cuflash::detail
