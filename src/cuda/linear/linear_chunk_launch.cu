// Launches of the chunked tensor-core forward (linear_chunk_forward.cuh): the
// workspace of block records, the three kernels, the per-(dtype, Dk) dispatch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "common/scratch.hpp"
#include "linear/linear_chunk_forward.cuh"
#include "linear/linear_chunk_launch.hpp"

namespace cuflash::detail {

namespace {

using linear::ChunkWorkspace;
using linear::kBlockRows;
using linear::LinearParams;

bool aligned16(const TensorView& view) {
  if (reinterpret_cast<std::uintptr_t>(view.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < view.rank; ++d)
    if (view.strides[d] % 8 != 0) return false;
  return true;
}

std::int64_t packed_rows(const LinearProblem& p) {
  return p.varlen ? p.q.shape[0] : static_cast<std::int64_t>(p.batch) * p.max_len;
}

std::int64_t record_floats(const LinearProblem& p) {
  return static_cast<std::int64_t>(p.key_dim) * p.value_dim + p.key_dim;
}

// Slots: first_row(b) / kBlockRows + b + block < packed_rows / kBlockRows + batch.
std::int64_t slots(const LinearProblem& p) { return packed_rows(p) / kBlockRows + p.batch; }

std::size_t records_bytes(const LinearProblem& p) {
  return align256(static_cast<std::size_t>(slots(p) * p.heads_kv * record_floats(p)) * sizeof(float));
}

std::size_t totals_bytes(const LinearProblem& p) {
  return p.causal ? 0 : align256(static_cast<std::size_t>(p.batch) * p.heads_kv * record_floats(p) * sizeof(float));
}

template <typename T, int DK>
Status launch_forward(const LinearProblem& problem, const LinearParams& params, ChunkWorkspace workspace,
                      cudaStream_t stream) {
  const int slices = params.value_dim / linear::kSlice;
  const int blocks = (params.seq_len + kBlockRows - 1) / kBlockRows;
  const std::size_t smem = sizeof(linear::ChunkSmem<T, DK>);
  if (blocks > 0) {
    const dim3 grid(blocks * slices, params.heads_kv, params.batch);
    auto* state_kernel = linear::linear_block_state_kernel<T, DK>;
    CUFLASH_TRY(allow_dynamic_smem(state_kernel, smem, "linear_block_state_kernel"));
    state_kernel<<<grid, linear::kChunkThreads, smem, stream>>>(params, workspace);
    CUFLASH_TRY(launch_status("linear_block_state_kernel"));
  }
  const unsigned elements = static_cast<unsigned>(record_floats(problem));
  const dim3 scan_grid((elements + linear::kScanThreads - 1) / linear::kScanThreads, params.heads_kv, params.batch);
  linear::linear_state_scan_kernel<<<scan_grid, linear::kScanThreads, 0, stream>>>(params, workspace);
  CUFLASH_TRY(launch_status("linear_state_scan_kernel"));
  if (blocks == 0) return {};
  const dim3 grid(blocks * slices, params.heads_kv, params.batch);
  auto* output_kernel = linear::linear_block_output_kernel<T, DK>;
  CUFLASH_TRY(allow_dynamic_smem(output_kernel, smem, "linear_block_output_kernel"));
  output_kernel<<<grid, linear::kChunkThreads, smem, stream>>>(params, workspace);
  return launch_status("linear_block_output_kernel");
}

template <typename T>
Status forward_for_dtype(const LinearProblem& problem, const LinearParams& params, ChunkWorkspace workspace,
                         cudaStream_t stream) {
  return problem.key_dim == 64 ? launch_forward<T, 64>(problem, params, workspace, stream)
                               : launch_forward<T, 128>(problem, params, workspace, stream);
}

}  // namespace

bool linear_chunk_supports(const LinearProblem& p) {
  if (p.pass != LinearPass::forward) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if ((p.key_dim != 64 && p.key_dim != 128) || (p.value_dim != 64 && p.value_dim != 128)) return false;
  if (p.heads_kv > 65535) return false;
  for (const TensorView* view : {&p.q, &p.k, &p.v, &p.out})
    if (!aligned16(*view)) return false;
  return true;
}

std::size_t linear_chunk_workspace_bytes(const LinearProblem& p) { return records_bytes(p) + totals_bytes(p); }

Status linear_chunk_forward(const LinearProblem& problem, const LinearParams& params, void* workspace,
                            cudaStream_t stream) {
  ChunkWorkspace w;
  w.records = static_cast<float*>(workspace);
  w.totals = reinterpret_cast<float*>(static_cast<char*>(workspace) + records_bytes(problem));
  return problem.dtype == DType::f16 ? forward_for_dtype<__half>(problem, params, w, stream)
                                     : forward_for_dtype<__nv_bfloat16>(problem, params, w, stream);
}

Status linear_chunk_backward(const LinearProblem& problem, const LinearParams&, void*, cudaStream_t) {
  return Status::unsupported("linear attention: backend cuda's tensor-core backward is not built");
}

}  // namespace cuflash::detail
