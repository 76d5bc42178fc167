// The states of the chunked linear-attention kernels: one walk per
// (sequence, kv head, 64 x 64 tile of the state) over the sequence's 64-row
// chunks, in order (the states) or in reverse (the gradient states), with
// the tile in fp32 registers. At each chunk it stores the running sum in the
// input's 16-bit type as the chunk's record (what the pass's tensor cores
// read, linear_chunk_pass.cuh), then adds the chunk's Bᵀ Vt of a pass's roles:
//   Pass::output, the states:          S += φK[:, i]ᵀ V[:, j]               and z += Σ_t φk_t
//   Pass::dv, the gradient states:     G += Σ_h (φQ_h/den)[:, i]ᵀ dO_h[:, j]  and g += Σ_h Σ_t -δ_t φq_t/den_t
// (= Σ φq dnumᵀ and Σ dden φq), from a start (the initial state, or the final
// state's gradient). The total goes to the call's output (final_state, or
// dinitial_state) and, non-causal, to the record of chunk 0, the only one the
// pass reads then. grid (Dk/64 x Dv/64, Hk, B x segments), 8 warps.
//
// Split (WalkSegments, for grids that leave SMs idle: batch 1 at long
// lengths), a first launch walks each segment of the chunks from 0 and keeps
// its sum; the second starts each segment from the walk's start plus the
// sums before it. Twice the reads, in a fraction of the chain's length.
//
// Why a walk and not per-block sums and a scan: the pass then keeps no state
// (every (chunk, slice, head) CTA is independent), and the walk's records are
// written once, in 16 bits. The walk is a chain, so its speed is its latency
// per chunk: the loads of the next kStages - 1 items fly while one computes
// (kWalkDeepStages when the grid leaves SMs free, kWalkShallowStages when
// more CTAs than the deep ring lets an SM hold must share the SMs:
// linear_chunk_launch.cuh).
// A chunk's record lives at chunk_slot(b, chunk) = first_row(b) / 64 + b + chunk
// (an upper bound of the chunks before it), so varlen needs no offset table.
#pragma once

#include "linear/linear_chunk_operands.cuh"

namespace cuflash::detail::linear {

__device__ __forceinline__ std::int64_t chunk_slot(const LinearParams& p, int b, const SequenceSpan& span, int chunk) {
  const std::int64_t first = p.cu_seqlens ? span.first : static_cast<std::int64_t>(b) * p.seq_len;
  return first / kChunk + b + chunk;
}

// The 16-bit state record [Dk][Dv] and the fp32 key sum [Dk] of (slot, hk).
template <typename T>
__device__ __forceinline__ T* state_record(const LinearParams& p, const ChunkWorkspace& w, std::int64_t slot, int hk) {
  return static_cast<T*>(w.states) + (slot * p.heads_kv + hk) * p.key_dim * p.value_dim;
}
__device__ __forceinline__ float* key_sum_record(const LinearParams& p, const ChunkWorkspace& w, std::int64_t slot,
                                                 int hk) {
  return w.key_sums + (slot * p.heads_kv + hk) * p.key_dim;
}

// Σ_r weight(r) tile[r][col] over the chunk's rows [0, count).
template <int W, typename T, typename Weight>
__device__ __forceinline__ float column_sum(const T* tile, int col, int count, Weight weight) {
  float sum = 0.0f;
  for (int r = 0; r < count; ++r) sum += weight(r) * to_float(tile[tile_index<W>(r, col)]);
  return sum;
}

// The (chunk, head) items of a walk over a segment's chunks [begin, end)
// in the order it runs them: chunk steps in order (reverse: from the last
// chunk), `heads` items per step (the key side's B and Vt are per query
// head: the group's rows all join the sum). Segment s of n holds the
// sequence's chunks [chunks s / n, chunks (s + 1) / n).
struct ChunkItems {
  int begin, end;
  int heads;
  bool reverse;

  __device__ __forceinline__ ChunkItems(const SequenceSpan& span, int heads_per_step, bool in_reverse, int segment,
                                        int segments)
      : heads(heads_per_step), reverse(in_reverse) {
    const int chunks = (span.length + kChunk - 1) / kChunk;
    begin = chunks * segment / segments;
    end = chunks * (segment + 1) / segments;
  }
  __device__ __forceinline__ int count() const { return (end - begin) * heads; }
  __device__ __forceinline__ int head(int item) const { return item % heads; }
  __device__ __forceinline__ int chunk(int item) const {
    const int step = item / heads;
    return reverse ? end - 1 - step : begin + step;
  }
};

// Segment sums of a split walk (ChunkWorkspace::segment_sums): the fp32 tile
// row of (b, segment, hk) and its key sum.
__device__ __forceinline__ float* segment_sum_row(const LinearParams& p, const ChunkWorkspace& w, int b, int segment,
                                                  int segments, int hk, int row) {
  const std::int64_t tile = (static_cast<std::int64_t>(b) * segments + segment) * p.heads_kv + hk;
  return w.segment_sums + (tile * p.key_dim + row) * p.value_dim;
}
__device__ __forceinline__ float* segment_key_sum(const LinearParams& p, const ChunkWorkspace& w, int b, int segment,
                                                  int segments, int hk) {
  return w.segment_key_sums + ((static_cast<std::int64_t>(b) * segments + segment) * p.heads_kv + hk) * p.key_dim;
}

constexpr int kWalkDeepStages = 4;
constexpr int kWalkShallowStages = 2;
constexpr int kWalkWarps = 8;
constexpr int kWalkThreads = 32 * kWalkWarps;

template <typename T>
struct WalkStage {
  alignas(128) T b[kChunk * kSlice];
  alignas(128) T vt[kChunk * kSlice];
  RowStats raw_stats[kChunk];
};

template <typename T, int kStages>
struct WalkSmem {
  WalkStage<T> stages[kStages];
  alignas(128) T staging[kSlice * kSlice];  // a record's tile on its way out, 16-bit; each warp its own part
  ChunkRowStats stats;                      // of the item's query head (key side)
};

// Warp w's part of the 64 x 64 state tile: rows [16 (w % 4), + 16) and
// columns [32 (w / 4), + 32), as four m16n8 accumulators.
struct WalkPart {
  int row0, col0;
  __device__ __forceinline__ WalkPart() : row0(threadIdx.x / 32 % 4 * 16), col0(threadIdx.x / 32 / 4 * 32) {}
  __device__ __forceinline__ int row(int e) const { return row0 + threadIdx.x % 32 / 4 + (e >= 2 ? 8 : 0); }
  __device__ __forceinline__ int col(int nt) const { return col0 + nt * 8 + 2 * (threadIdx.x % 4); }
};

// f(lo, hi, row, col) for each two adjacent accumulator elements (columns col, col + 1).
template <typename Acc, typename F>
__device__ __forceinline__ void for_each_walk_pair(const WalkPart& part, Acc& acc, F f) {
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) f(acc[nt][2 * half], acc[nt][2 * half + 1], part.row(2 * half), part.col(nt));
}

// The warp's part of the state, in 16 bits, to its tile of `record` (the
// record's row row0 and column col0 at `record`) through its own part of the
// staging tile: no barrier but the warp's.
template <typename T>
__device__ __forceinline__ void store_walk_part(const WalkPart& part, const float (&acc)[4][4], T* staging, T* record,
                                                std::int64_t row_stride) {
  for_each_walk_pair(part, acc, [&](float lo, float hi, int row, int col) {
    *reinterpret_cast<std::uint32_t*>(staging + tile_index<kSlice>(row, col)) = sm80::pack2<T>(lo, hi);
  });
  __syncwarp();
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // 16 rows x 4 chunks of 16 bytes
    const int row = part.row0 + (lane + 32 * i) / 4, chunk = part.col0 / 8 + lane % 4;
    *reinterpret_cast<uint4*>(record + row * row_stride + chunk * 8) =
        *reinterpret_cast<const uint4*>(staging + SwizzledRows<kSlice>::offset(row, chunk));
  }
  __syncwarp();  // the warp's reads of its part are done before its next writes
}

// kPass: Pass::output (the states) or Pass::dv (the gradient states); its
// roles' B (a 64-column slice of Dk) and Vt (of Dv) are summed. 8 warps:
// the walk is a chain of dependent steps, and two warps per scheduler hide
// each other's latency. At most 64 registers, so that four CTAs of the
// shallow ring share an SM (a cap that costs the deep ring nothing: 62 without it).
template <typename T, Pass kPass, int kStages>
__global__ void __launch_bounds__(kWalkThreads, 4) linear_state_walk_kernel(LinearParams p, ChunkWorkspace w,
                                                                         WalkEnds ends, WalkSegments segments) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  static_assert(of_key_dim(kRoles.b) && !of_key_dim(kRoles.vt), "a state is [Dk][Dv]");
  static_assert(!kRoles.key_side || kRoles.vt == Operand::dout, "Vt is never transformed in a tile");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<WalkSmem<T, kStages>*>(smem_bytes);
  const int column_tiles = p.value_dim / kSlice;
  const int row0 = blockIdx.x / column_tiles * kSlice, col0 = blockIdx.x % column_tiles * kSlice;
  const int hk = blockIdx.y, b = blockIdx.z / segments.count, segment = blockIdx.z % segments.count;
  // The segment the walk ends in: it writes the totals (and non-causal, chunk 0's record).
  const bool last_segment = ends.reverse ? segment == 0 : segment == segments.count - 1;
  const bool split = segments.count > 1;
  // Split and non-causal, the records launch has no rows to walk: the
  // total is the start plus every segment's sum, and only the last
  // segment's CTAs store it.
  const bool walks = segments.sums_only || !split || p.causal;
  if (!walks && !last_segment) return;
  // Causal, no segment starts after the last one: its sum is never read.
  if (segments.sums_only && p.causal && last_segment) return;
  const bool stores_records = !segments.sums_only;
  const SequenceSpan span = sequence_span(p, b);
  const ChunkItems items(span, kRoles.key_side ? p.group : 1, ends.reverse, walks ? segment : 0,
                         walks ? segments.count : 1);
  const int item_count = walks ? items.count() : 0;
  const WalkPart part;
  auto head_of = [&](int item) { return kRoles.key_side ? hk * p.group + items.head(item) : hk; };
  // Row 0 of the sequence (head 0) of B's and Vt's views at the CTA's
  // columns, once: the issue, on the walk's chain, adds a head and a chunk.
  const RowsView& b_view = operand_view(p, kRoles.b);
  const RowsView& vt_view = operand_view(p, kRoles.vt);
  const T* const b_rows = row_pointer<const T>(b_view, b, span, 0, 0) + row0;
  const T* const vt_rows = row_pointer<const T>(vt_view, b, span, 0, 0) + col0;
  auto issue = [&](int item) {
    if (item < item_count) {
      const int first = items.chunk(item) * kChunk, count = min(kChunk, span.length - first), head = head_of(item);
      WalkStage<T>& stage = smem.stages[item % kStages];
      load_tile_async<kSlice, kWalkThreads>(stage.b, b_rows + head * b_view.head_stride + first * b_view.row_stride,
                                            b_view.row_stride, count);
      load_tile_async<kSlice, kWalkThreads>(stage.vt, vt_rows + head * vt_view.head_stride + first * vt_view.row_stride,
                                            vt_view.row_stride, count);
      if (kRoles.key_side) load_row_stats_async(stage.raw_stats, p, w.row_stats, b, span, first, count, head);
    }
    sm80::cp_async_commit();  // past the end an empty group: the count of groups in flight stays right
  };
  // The segments whose sums come before this one's start (all of them when it does not walk).
  auto before = [&](int other) {
    return !walks || (ends.reverse ? other > segment : other < segment);
  };

  // Column row0 + threadIdx.x of the key sum, kept by the CTAs of the first column tile.
  const bool sums_keys = p.normalize && col0 == 0 && threadIdx.x < kSlice;
  float state[4][4];
  float key_sum = 0.0f;
  for_each_walk_pair(part, state, [&](float& lo, float& hi, int row, int col) {
    const float* start = ends.start_state.data && stores_records ? ends.start_state.at(b, hk, row0 + row) + col0 + col
                                                                 : nullptr;
    lo = start ? start[0] : 0.0f;
    hi = start ? start[1] : 0.0f;
  });
  if (sums_keys && stores_records && ends.start_key_sum.data)
    key_sum = ends.start_key_sum.at(b, hk, 0)[row0 + threadIdx.x];
  if (split && stores_records)
    for (int other = 0; other < segments.count; ++other) {
      if (!before(other)) continue;
      for_each_walk_pair(part, state, [&](float& lo, float& hi, int row, int col) {
        const float2 sum = *reinterpret_cast<const float2*>(
            segment_sum_row(p, w, b, other, segments.count, hk, row0 + row) + col0 + col);
        lo += sum.x;
        hi += sum.y;
      });
      if (sums_keys) key_sum += segment_key_sum(p, w, b, other, segments.count, hk)[row0 + threadIdx.x];
    }
  // An untransformed B (φ(q) of the identity, without normalize) carries the
  // scale; Vt (v or dout) is never transformed.
  const float b_multiplier = operand_multiplier(p, kRoles.b);
  const bool b_transformed = transformed_in_tile(p, kRoles.b);
  // The key side's statistics: 1/den for B's transform (1 for the rows of
  // the sequence without normalize, 0 past it) and -δ for the key sum.
  const bool needs_stats = kRoles.key_side && (p.normalize || b_transformed);

  // The running sum (and key sum) as the record of `chunk`.
  auto store_record = [&](int chunk) {
    const std::int64_t slot = chunk_slot(p, b, span, chunk);
    store_walk_part(part, state, smem.staging,
                    state_record<T>(p, w, slot, hk) + static_cast<std::int64_t>(row0) * p.value_dim + col0,
                    p.value_dim);
    if (sums_keys) key_sum_record(p, w, slot, hk)[row0 + threadIdx.x] = key_sum;
  };

  for (int s = 0; s + 1 < kStages; ++s) issue(s);
  for (int item = 0; item < item_count; ++item) {
    WalkStage<T>& stage = smem.stages[item % kStages];
    const int chunk = items.chunk(item), count = min(kChunk, span.length - chunk * kChunk);
    sm80::cp_async_wait<kStages - 2>();
    // The item's tiles landed; every thread is done with the stage the issue
    // at the end overwrites (the previous item's) and with the statistics.
    __syncthreads();
    if (needs_stats) {
      convert_row_stats(smem.stats, p, stage.raw_stats, count);
      __syncthreads();
    }
    if (b_transformed) {
      transform_operand<kSlice, kWalkThreads>(stage.b, p, kRoles.b, count, smem.stats);
      __syncthreads();
    }
    // A step's record: the sum before its rows.
    if (p.causal && stores_records && items.head(item) == 0) store_record(chunk);
    if (sums_keys)
      key_sum += column_sum<kSlice>(stage.b, threadIdx.x, count,
                                    [&](int r) { return kRoles.key_side ? smem.stats.minus_delta[r] : 1.0f; });
    accumulate_transposed_products<1, 4, kSlice>(state, stage.b, stage.vt, part.row0, part.col0, b_multiplier);
    // After the products, not before: their chain starts at the barrier, and
    // the issue's address arithmetic runs under their latency.
    issue(item + kStages - 1);
  }

  if (segments.sums_only) {  // the segment's own sum, for the records launch
    for_each_walk_pair(part, state, [&](float lo, float hi, int row, int col) {
      *reinterpret_cast<float2*>(segment_sum_row(p, w, b, segment, segments.count, hk, row0 + row) + col0 + col) =
          make_float2(lo, hi);
    });
    if (sums_keys) segment_key_sum(p, w, b, segment, segments.count, hk)[row0 + threadIdx.x] = key_sum;
    return;
  }
  if (!last_segment) return;
  for_each_walk_pair(part, state, [&](float lo, float hi, int row, int col) {
    if (!ends.total_state.data) return;
    float* total = ends.total_state.at(b, hk, row0 + row) + col0 + col;  // any strides: no float2
    total[0] = lo;
    total[1] = hi;
  });
  if (sums_keys && ends.total_key_sum.data) ends.total_key_sum.at(b, hk, 0)[row0 + threadIdx.x] = key_sum;
  if (p.causal) return;
  store_record(0);  // non-causal: the total is every chunk's S'
}

}  // namespace cuflash::detail::linear
