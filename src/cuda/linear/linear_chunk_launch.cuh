// What the launches of the chunked tensor-core kernels share
// (linear_chunk_launch.cu: support, workspace and the forward;
// linear_chunk_backward.cu: the backward): the workspace's layout, the grid
// of a per-block kernel, and the per-head-dim dispatch of a pass.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "common/scratch.hpp"
#include "linear/linear_chunk_pass.cuh"
#include "linear_problem.hpp"

namespace cuflash::detail::linear {

inline std::int64_t packed_rows(const LinearProblem& p) {
  return p.varlen ? p.q.shape[0] : static_cast<std::int64_t>(p.batch) * p.max_len;
}

inline std::int64_t record_floats(const LinearProblem& p) {
  return static_cast<std::int64_t>(p.key_dim) * p.value_dim + p.key_dim;
}

// Slots: first_row(b) / kBlockRows + b + block < packed_rows / kBlockRows + batch.
inline std::size_t records_bytes(const LinearProblem& p) {
  const std::int64_t slots = packed_rows(p) / kBlockRows + p.batch;
  return align256(static_cast<std::size_t>(slots * p.heads_kv * record_floats(p)) * sizeof(float));
}

inline std::size_t totals_bytes(const LinearProblem& p) {
  return p.causal ? 0 : align256(static_cast<std::size_t>(p.batch) * p.heads_kv * record_floats(p) * sizeof(float));
}

inline std::size_t row_stats_bytes(const LinearProblem& p) {
  if (p.pass != LinearPass::backward || !p.normalize) return 0;
  return align256(static_cast<std::size_t>(packed_rows(p)) * p.heads_q * sizeof(RowStats));
}

// records, totals, row_stats: the backward reuses records and totals for the
// gradient states once dq (the last reader of the states) is done.
inline ChunkWorkspace chunk_workspace(const LinearProblem& p, void* workspace) {
  char* bytes = static_cast<char*>(workspace);
  ChunkWorkspace w;
  w.records = reinterpret_cast<float*>(bytes);
  w.totals = reinterpret_cast<float*>(bytes + records_bytes(p));
  w.row_stats = reinterpret_cast<RowStats*>(bytes + records_bytes(p) + totals_bytes(p));
  return w;
}

// launch(tag), tag a value of the problem's 16-bit type.
template <typename Launch>
Status for_half_dtype(DType dtype, Launch launch) {
  return dtype == DType::f16 ? launch(__half{}) : launch(__nv_bfloat16{});
}

inline int block_count(const LinearParams& p) { return (p.seq_len + kBlockRows - 1) / kBlockRows; }

// A per-block kernel: grid (blocks x slices, Hk, B), 4 warps. Nothing to do
// without rows (the scans still run).
template <typename Kernel>
Status launch_per_block(Kernel* kernel, int slices, std::size_t smem, const char* name, const LinearParams& p,
                        const ChunkWorkspace& w, cudaStream_t stream) {
  if (block_count(p) == 0) return {};
  CUFLASH_TRY(allow_dynamic_smem(kernel, smem, name));
  kernel<<<dim3(block_count(p) * slices, p.heads_kv, p.batch), kChunkThreads, smem, stream>>>(p, w);
  return launch_status(name);
}

// block_sum (the states: Pass::output; the gradient states: Pass::dv), its
// Dk picked at run time.
template <typename T, Pass kPass>
Status launch_block_sum(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  const char* name =
      kPass == Pass::output ? "linear_block_sum_kernel(states)" : "linear_block_sum_kernel(gradient states)";
  const int slices = p.value_dim / kSlice;
  if (p.key_dim == 64)
    return launch_per_block(linear_block_sum_kernel<T, 64, kPass>, slices, sizeof(BlockSumSmem<T, 64>), name, p, w,
                            stream);
  return launch_per_block(linear_block_sum_kernel<T, 128, kPass>, slices, sizeof(BlockSumSmem<T, 128>), name, p, w,
                          stream);
}

constexpr const char* pass_kernel_name(Pass pass) {
  switch (pass) {
    case Pass::output: return "linear_chunk_pass_kernel(output)";
    case Pass::row_stats: return "linear_chunk_pass_kernel(row_stats)";
    case Pass::dq: return "linear_chunk_pass_kernel(dq)";
    case Pass::dv: return "linear_chunk_pass_kernel(dv)";
    default: return "linear_chunk_pass_kernel(dk)";
  }
}

// A pass, its DR (the width of A and B: Dk or Dv) picked at run time.
template <typename T, Pass kPass>
Status launch_pass(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  const int slices = operand_width(p, kRoles.vt) / kSlice;
  if (operand_width(p, kRoles.a) == 64)
    return launch_per_block(linear_chunk_pass_kernel<T, 64, kPass>, slices, sizeof(PassSmem<T, 64>),
                            pass_kernel_name(kPass), p, w, stream);
  return launch_per_block(linear_chunk_pass_kernel<T, 128, kPass>, slices, sizeof(PassSmem<T, 128>),
                          pass_kernel_name(kPass), p, w, stream);
}

// Launches 1-2 of the forward, which the backward repeats: the states at the
// blocks' starts (non-causal: the totals) from the initial state, the total
// to final_state / final_key_sum where given (linear_chunk_launch.cu, for
// __half and __nv_bfloat16).
template <typename T>
Status launch_states(const LinearProblem& problem, const LinearParams& p, const ChunkWorkspace& w,
                     cudaStream_t stream);
// The scan of launch 2 (and of the gradient states): one thread per record element.
Status launch_state_scan(const LinearProblem& problem, const LinearParams& p, const ChunkWorkspace& w,
                         const ScanEnds& ends, cudaStream_t stream);

}  // namespace cuflash::detail::linear
