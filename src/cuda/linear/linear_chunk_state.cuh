// The states at block boundaries of the chunked linear-attention kernels, in
// two launches that every pass of linear_chunk_pass.cuh starts from:
//  1. block_sum:  grid (blocks x Dv slices, Hk, B). Each CTA sums one block's
//     (kBlockRows rows, 4 chunks) Bᵀ Vt [Dk x 64] of a pass's roles into its
//     fp32 record, and in slice 0 (normalize) the weighted column sums of B:
//       Pass::output, the states:          φKᵀ V              and Σ φk
//       Pass::dv, the gradient states:     Σ_h (φQ_h/den)ᵀ dO_h and Σ_h Σ_t -δ_t φq_t/den_t
//     (= Σ φq dnumᵀ and Σ dden φq). All blocks of all heads in parallel.
//  2. state_scan: grid (record elements / 256, Hk, B). Per element, a
//     sequential exclusive scan over the sequence's blocks in place, from a
//     start (initial state, or the final state's gradient) forward or in
//     reverse: a record becomes the state at its block's start (the gradient
//     of the state at its block's end); the total goes to the call's output
//     (final state, or dinitial_state) and, non-causal, to the totals record.
// A block's record lives at slot(b, block) = first_row(b) / kBlockRows + b + block
// (an upper bound of the blocks before it), so no table of offsets is needed.
#pragma once

#include "linear/linear_chunk_operands.cuh"

namespace cuflash::detail::linear {

__device__ __forceinline__ std::int64_t block_slot(const LinearParams& p, int b, const SequenceSpan& span, int block) {
  const std::int64_t first = p.cu_seqlens ? span.first : static_cast<std::int64_t>(b) * p.seq_len;
  return first / kBlockRows + b + block;
}

__device__ __forceinline__ std::int64_t record_floats(const LinearParams& p) {
  return static_cast<std::int64_t>(p.key_dim) * p.value_dim + p.key_dim;
}

// The record of (b, block, hk), or with !causal the totals record of (b, hk).
__device__ __forceinline__ float* block_record(const LinearParams& p, const ChunkWorkspace& w, int b,
                                               const SequenceSpan& span, int block, int hk) {
  if (!p.causal) return w.totals + (static_cast<std::int64_t>(b) * p.heads_kv + hk) * record_floats(p);
  return w.records + (block_slot(p, b, span, block) * p.heads_kv + hk) * record_floats(p);
}

// Σ_r weight(r) tile[r][col] over the chunk's rows [0, count).
template <int W, typename T, typename Weight>
__device__ __forceinline__ float column_sum(const T* tile, int col, int count, Weight weight) {
  float sum = 0.0f;
  for (int r = 0; r < count; ++r) sum += weight(r) * to_float(tile[tile_index<W>(r, col)]);
  return sum;
}

template <typename T, int DK>
struct BlockSumSmem {
  alignas(128) T b[kChunk * DK];
  alignas(128) T vt[kChunk * kSlice];
  ChunkRowStats stats;
};

// kPass: Pass::output (the states) or Pass::dv (the gradient states); its
// roles' B and Vt are summed, B of Dk columns and Vt a 64-column slice of Dv.
template <typename T, int DK, Pass kPass>
__global__ void __launch_bounds__(kChunkThreads) linear_block_sum_kernel(LinearParams p, ChunkWorkspace w) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  static_assert(of_key_dim(kRoles.b) && !of_key_dim(kRoles.vt), "a record is [Dk][Dv]");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<BlockSumSmem<T, DK>*>(smem_bytes);
  const int slices = p.value_dim / kSlice;
  const int block = blockIdx.x / slices, slice = blockIdx.x % slices;
  const int hk = blockIdx.y, b = blockIdx.z;
  const SequenceSpan span = sequence_span(p, b);
  const int block_first = block * kBlockRows;
  if (block_first >= span.length) return;
  // The key side's B and Vt are per query head: its group's rows all join the sum.
  const int heads = kRoles.key_side ? p.group : 1;

  float acc[DK / 64][8][4] = {};
  const bool sums_column = p.normalize && slice == 0 && threadIdx.x < DK;
  float column_part = 0.0f;  // column threadIdx.x of the weighted column sums of B
  for (int c = 0; c < kBlockChunks; ++c) {
    const int first = block_first + c * kChunk;
    if (first >= span.length) break;
    const int count = min(kChunk, span.length - first);
    for (int g = 0; g < heads; ++g) {
      const int head = kRoles.key_side ? hk * p.group + g : hk;
      load_operand_async<DK>(smem.b, p, kRoles.b, b, span, first, count, head, 0);
      load_operand_async<kSlice>(smem.vt, p, kRoles.vt, b, span, first, count, head, slice * kSlice);
      if (kRoles.key_side) load_chunk_row_stats(smem.stats, p, w.row_stats, b, span, first, count, head);
      sm80::cp_async_wait<0>();
      __syncthreads();
      transform_operand<DK>(smem.b, p, kRoles.b, count, smem.stats);
      transform_operand<kSlice>(smem.vt, p, kRoles.vt, count, smem.stats);
      __syncthreads();
      if (sums_column)
        column_part += column_sum<DK>(smem.b, threadIdx.x, count, [&](int r) {
          return kRoles.key_side ? smem.stats.minus_delta[r] : 1.0f;
        });
      accumulate_state<DK>(acc, smem.b, smem.vt);
      __syncthreads();  // before the next tiles overwrite these
    }
  }
  float* record = w.records + (block_slot(p, b, span, block) * p.heads_kv + hk) * record_floats(p);
  for_each_state_pair<DK>(acc, [&](float lo, float hi, int row, int col) {
    *reinterpret_cast<float2*>(record + static_cast<std::int64_t>(row) * p.value_dim + slice * kSlice + col) =
        make_float2(lo, hi);
  });
  if (sums_column) record[static_cast<std::int64_t>(DK) * p.value_dim + threadIdx.x] = column_part;
}

constexpr int kScanThreads = 256;

// One thread per record element (state, then key sum, which only normalize reads);
// defined in linear_chunk_launch.cu, the one file that launches it (a non-template
// kernel defined here would be defined again in every file that includes this).
__global__ void linear_state_scan_kernel(LinearParams p, ChunkWorkspace w, ScanEnds ends);

}  // namespace cuflash::detail::linear
