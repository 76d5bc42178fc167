// The chunked tensor-core path of linear attention (linear_chunk_pass.cuh):
// which problems it takes, its fp32 workspace, and its launches.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "linear/linear_params.hpp"
#include "linear_problem.hpp"

namespace cuflash::detail {

// f16/bf16, Dk and Dv in {64, 128}, the rows of every q/k/v-like view
// 16-byte aligned (cp.async), a forward or a backward (not the decode step, a
// GEMV that the SIMT kernel runs), and CUFLASH_LINEAR_KERNEL not `simt`.
// Anything else valid runs the SIMT recurrence of the same backend.
bool linear_chunk_supports(const LinearProblem& problem);
std::size_t linear_chunk_workspace_bytes(const LinearProblem& problem);
// linear_chunk_launch.cu
Status linear_chunk_forward(const LinearProblem& problem, const linear::LinearParams& params, void* workspace,
                            cudaStream_t stream);
// linear_chunk_backward.cu
Status linear_chunk_backward(const LinearProblem& problem, const linear::LinearParams& params, void* workspace,
                             cudaStream_t stream);

}  // namespace cuflash::detail
