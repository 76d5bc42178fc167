// What the launches of the chunked tensor-core kernels share
// (linear_chunk_launch.cu: support, workspace and the forward;
// linear_chunk_backward.cu: the backward): the workspace's layout, the
// walk's and the pass's grids, and the per-head-dim dispatch of a pass.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/kernel_attributes.hpp"
#include "common/scratch.hpp"
#include "linear/linear_chunk_fused.cuh"
#include "linear/linear_chunk_pass.cuh"
#include "linear/linear_walk_segments.hpp"
#include "linear_problem.hpp"

namespace cuflash::detail::linear {

// How a problem runs on the chunked kernels, decided once per call
// (chunk_plan, linear_chunk_launch.cu), so that the workspace's size and the
// launches agree.
struct ChunkPlan {
  // The causal forward in one kernel (linear_chunk_fused.cuh): no records,
  // only the segment sums. Otherwise the walk's records and the passes.
  bool fused_forward = false;
  int segments = 1;  // of the fused forward, or of each walk (walk_segments)
};
ChunkPlan chunk_plan(const LinearProblem& p);

// Slots: first_row(b) / kChunk + b + chunk < packed_rows / kChunk + batch.
inline std::int64_t chunk_slots(const LinearProblem& p) { return p.packed_rows() / kChunk + p.batch; }

inline std::size_t states_bytes(const ChunkPlan& plan, const LinearProblem& p) {
  if (plan.fused_forward) return 0;
  return align256(static_cast<std::size_t>(chunk_slots(p) * p.heads_kv * p.key_dim * p.value_dim) * dtype_size(p.dtype));
}

inline std::size_t key_sums_bytes(const ChunkPlan& plan, const LinearProblem& p) {
  if (plan.fused_forward || !p.normalize) return 0;
  return align256(static_cast<std::size_t>(chunk_slots(p) * p.heads_kv * p.key_dim) * sizeof(float));
}

inline int walk_segments(const LinearParams& p) {
  return walk_segments(p.batch, p.heads_kv, p.key_dim, p.value_dim, p.seq_len);
}

inline std::size_t segment_sums_bytes(const ChunkPlan& plan, const LinearProblem& p) {
  if (plan.segments == 1) return 0;
  return align256(static_cast<std::size_t>(p.batch) * plan.segments * p.heads_kv * p.key_dim * p.value_dim *
                  sizeof(float));
}

inline std::size_t segment_key_sums_bytes(const ChunkPlan& plan, const LinearProblem& p) {
  if (plan.segments == 1 || !p.normalize) return 0;
  return align256(static_cast<std::size_t>(p.batch) * plan.segments * p.heads_kv * p.key_dim * sizeof(float));
}

inline std::size_t row_stats_bytes(const LinearProblem& p) {
  if (p.pass != LinearPass::backward || !p.normalize) return 0;
  return align256(static_cast<std::size_t>(p.packed_rows()) * p.heads_q * sizeof(RowStats));
}

inline std::size_t chunk_workspace_bytes(const ChunkPlan& plan, const LinearProblem& p) {
  return states_bytes(plan, p) + key_sums_bytes(plan, p) + row_stats_bytes(p) + segment_sums_bytes(plan, p) +
         segment_key_sums_bytes(plan, p);
}

// states, key_sums, row_stats, segment sums: the backward reuses states and
// key_sums for the gradient states once dq (the last reader of the states)
// is done, and the segment sums for each walk.
inline ChunkWorkspace chunk_workspace(const ChunkPlan& plan, const LinearProblem& p, void* workspace) {
  char* bytes = static_cast<char*>(workspace);
  ChunkWorkspace w;
  w.states = bytes;
  bytes += states_bytes(plan, p);
  w.key_sums = reinterpret_cast<float*>(bytes);
  bytes += key_sums_bytes(plan, p);
  w.row_stats = reinterpret_cast<RowStats*>(bytes);
  bytes += row_stats_bytes(p);
  w.segment_sums = reinterpret_cast<float*>(bytes);
  bytes += segment_sums_bytes(plan, p);
  w.segment_key_sums = reinterpret_cast<float*>(bytes);
  return w;
}

// launch(tag), tag a value of the problem's 16-bit type.
template <typename Launch>
Status for_half_dtype(DType dtype, Launch launch) {
  return dtype == DType::f16 ? launch(__half{}) : launch(__nv_bfloat16{});
}

inline int chunk_count(const LinearParams& p) { return (p.seq_len + kChunk - 1) / kChunk; }

template <typename T, Pass kPass, int kStages>
Status launch_walk_with(const LinearParams& p, const ChunkWorkspace& w, const WalkEnds& ends,
                        const WalkSegments& segments, dim3 grid, cudaStream_t stream) {
  const char* name = segments.sums_only ? (kPass == Pass::output ? "linear_state_walk_kernel(state segment sums)"
                                                                 : "linear_state_walk_kernel(gradient segment sums)")
                                        : (kPass == Pass::output ? "linear_state_walk_kernel(states)"
                                                                 : "linear_state_walk_kernel(gradient states)");
  auto* kernel = linear_state_walk_kernel<T, kPass, kStages>;
  constexpr std::size_t smem = sizeof(WalkSmem<T, kStages>);
  CUFLASH_TRY(allow_dynamic_smem(kernel, smem, name));
  kernel<<<grid, kWalkThreads, smem, stream>>>(p, w, ends, segments);
  return launch_status(name);
}

// One launch of a walk of the states (Pass::output) or of the gradient
// states (Pass::dv): grid (Dk/64 x Dv/64, Hk, B x segments), 8 warps. The
// deep ring of loads when every CTA finds an SM place at once, the shallow
// one (more CTAs per SM) when the grid would otherwise run in two waves.
template <typename T, Pass kPass>
Status launch_walk_once(const LinearParams& p, const ChunkWorkspace& w, const WalkEnds& ends,
                        const WalkSegments& segments, cudaStream_t stream) {
  const dim3 grid((p.key_dim / kSlice) * (p.value_dim / kSlice), p.heads_kv, p.batch * segments.count);
  const std::int64_t ctas = static_cast<std::int64_t>(grid.x) * grid.y * grid.z;
  int device = 0;
  CUFLASH_TRY(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  const DeviceInfo& info = device_info(device);
  constexpr std::size_t kReservedPerCta = 1024;  // the shared memory the driver keeps per CTA
  const std::int64_t deep_slots =
      info.valid ? static_cast<std::int64_t>(info.sm_count) *
                       (info.smem_per_sm / (sizeof(WalkSmem<T, kWalkDeepStages>) + kReservedPerCta))
                 : ctas;
  return ctas <= deep_slots ? launch_walk_with<T, kPass, kWalkDeepStages>(p, w, ends, segments, grid, stream)
                            : launch_walk_with<T, kPass, kWalkShallowStages>(p, w, ends, segments, grid, stream);
}

// The walk: split (walk_segments), the segment sums' launch first. It runs
// without rows too (the totals are the starts).
template <typename T, Pass kPass>
Status launch_walk(const LinearParams& p, const ChunkWorkspace& w, const WalkEnds& ends, cudaStream_t stream) {
  WalkSegments segments;
  segments.count = walk_segments(p);
  if (segments.count > 1) {
    segments.sums_only = true;
    CUFLASH_TRY((launch_walk_once<T, kPass>(p, w, ends, segments, stream)));
    segments.sums_only = false;
  }
  return launch_walk_once<T, kPass>(p, w, ends, segments, stream);
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

// A pass: grid (chunks x slices, Hk, B), 4 warps; its DR (the width of A
// and B: Dk or Dv) picked at run time. Nothing to do without rows.
template <typename T, int DR, Pass kPass>
Status launch_pass_of_width(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  if (chunk_count(p) == 0) return {};
  auto* kernel = linear_chunk_pass_kernel<T, DR, kPass>;
  // A second set of tiles only when a CTA runs several heads.
  const bool several_heads = p.group > 1 && (p.causal || !kRoles.key_side);
  const std::size_t smem = pass_smem_bytes<T, DR>(several_heads);
  CUFLASH_TRY(allow_dynamic_smem(kernel, pass_smem_bytes<T, DR>(true), pass_kernel_name(kPass)));
  const int slices = operand_width(p, kRoles.vt) / kSlice;
  kernel<<<dim3(chunk_count(p) * slices, p.heads_kv, p.batch), kChunkThreads, smem, stream>>>(p, w);
  return launch_status(pass_kernel_name(kPass));
}

template <typename T, Pass kPass>
Status launch_pass(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  if (operand_width(p, pass_roles(kPass).a) == 64) return launch_pass_of_width<T, 64, kPass>(p, w, stream);
  return launch_pass_of_width<T, 128, kPass>(p, w, stream);
}

// The causal forward in one kernel (linear_chunk_fused.cuh): grid (Dv/64,
// Hk, B x segments), 4 warps; split (plan.segments), the walk kernel's
// segment sums first. It runs without rows too (the totals are the starts).
template <typename T, int DR>
Status launch_fused_forward_of_width(const LinearParams& p, const ChunkWorkspace& w, const WalkSegments& segments,
                                     cudaStream_t stream) {
  constexpr const char* kName = "linear_fused_forward_kernel";
  auto* kernel = linear_fused_forward_kernel<T, DR, kFusedStages>;
  constexpr std::size_t smem = sizeof(FusedSmem<T, DR, kFusedStages>);
  CUFLASH_TRY(allow_dynamic_smem(kernel, smem, kName));
  kernel<<<dim3(p.value_dim / kSlice, p.heads_kv, p.batch * segments.count), kChunkThreads, smem, stream>>>(p, w,
                                                                                                        segments);
  return launch_status(kName);
}

template <typename T>
Status launch_fused_forward(const LinearParams& p, const ChunkWorkspace& w, int segment_count, cudaStream_t stream) {
  WalkSegments segments;
  segments.count = segment_count;
  if (segment_count > 1) {
    segments.sums_only = true;
    CUFLASH_TRY((launch_walk_once<T, Pass::output>(p, w, WalkEnds{}, segments, stream)));
    segments.sums_only = false;
  }
  if (p.key_dim == 64) return launch_fused_forward_of_width<T, 64>(p, w, segments, stream);
  return launch_fused_forward_of_width<T, 128>(p, w, segments, stream);
}

// The forward's walk, which the backward repeats: the states at the chunks'
// starts (non-causal: the totals) from the initial state, the total to
// final_state / final_key_sum where given.
template <typename T>
Status launch_states(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  WalkEnds ends;
  ends.start_state = p.initial_state;
  ends.start_key_sum = p.initial_key_sum;
  ends.total_state = p.final_state;
  ends.total_key_sum = p.final_key_sum;
  return launch_walk<T, Pass::output>(p, w, ends, stream);
}

}  // namespace cuflash::detail::linear
