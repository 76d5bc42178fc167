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

// The (chunk, head) items of a block in the order a kernel runs them: chunk
// steps in order (reverse: from the block's last chunk), `heads` items per
// step. Item i's tiles load into buffer set i % 2 while item i - 1 computes
// on the other (a step's tiles into set step % 2).
struct BlockItems {
  int block_first;
  int chunks;  // chunks of the block that hold rows of the sequence
  int heads;
  bool reverse;

  __device__ __forceinline__ BlockItems(int block, const SequenceSpan& span, int heads_per_step, bool in_reverse)
      : block_first(block * kBlockRows),
        chunks(min(kBlockChunks, (span.length - block * kBlockRows + kChunk - 1) / kChunk)),
        heads(heads_per_step),
        reverse(in_reverse) {}
  __device__ __forceinline__ int count() const { return chunks * heads; }
  __device__ __forceinline__ int step(int item) const { return item / heads; }
  __device__ __forceinline__ int head(int item) const { return item % heads; }
  // First row of the item's chunk in the sequence.
  __device__ __forceinline__ int first_row(int item) const {
    return block_first + (reverse ? chunks - 1 - step(item) : step(item)) * kChunk;
  }
};

template <typename T, int DK>
struct BlockSumSmem {
  alignas(128) T b[2][kChunk * DK];
  alignas(128) T vt[2][kChunk * kSlice];
  RowStats raw_stats[2][kChunk];
  ChunkRowStats stats;
};

// kPass: Pass::output (the states) or Pass::dv (the gradient states); its
// roles' B and Vt are summed, B of Dk columns and Vt a 64-column slice of Dv.
// An item's loads fly while the previous item computes.
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
  if (block * kBlockRows >= span.length) return;
  // The key side's B and Vt are per query head: its group's rows all join the sum.
  const BlockItems items(block, span, kRoles.key_side ? p.group : 1, false);
  auto head_of = [&](int item) { return kRoles.key_side ? hk * p.group + items.head(item) : hk; };
  auto issue = [&](int item) {
    const int first = items.first_row(item), count = min(kChunk, span.length - first), buffer = item % 2;
    load_operand_async<DK>(smem.b[buffer], p, kRoles.b, b, span, first, count, head_of(item), 0);
    load_operand_async<kSlice>(smem.vt[buffer], p, kRoles.vt, b, span, first, count, head_of(item), slice * kSlice);
    if (kRoles.key_side)
      load_row_stats_async(smem.raw_stats[buffer], p, w.row_stats, b, span, first, count, head_of(item));
  };

  float acc[DK / 64][8][4] = {};
  const bool sums_column = p.normalize && slice == 0 && threadIdx.x < DK;
  float column_part = 0.0f;  // column threadIdx.x of the weighted column sums of B
  issue(0);
  for (int item = 0; item < items.count(); ++item) {
    const int count = min(kChunk, span.length - items.first_row(item)), buffer = item % 2;
    sm80::cp_async_wait<0>();
    __syncthreads();  // the item's tiles landed; the previous item's readers are done with the other set
    if (item + 1 < items.count()) issue(item + 1);
    if (kRoles.key_side) {
      convert_row_stats(smem.stats, p, smem.raw_stats[buffer], count);
      __syncthreads();
    }
    transform_operand<DK>(smem.b[buffer], p, kRoles.b, count, smem.stats);
    transform_operand<kSlice>(smem.vt[buffer], p, kRoles.vt, count, smem.stats);
    __syncthreads();
    if (sums_column)
      column_part += column_sum<DK>(smem.b[buffer], threadIdx.x, count, [&](int r) {
        return kRoles.key_side ? smem.stats.minus_delta[r] : 1.0f;
      });
    accumulate_state<DK>(acc, smem.b[buffer], smem.vt[buffer]);
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
