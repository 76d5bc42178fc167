// The causal forward in one kernel: the state walk (linear_chunk_state.cuh)
// and the output pass (linear_chunk_pass.cuh) fused, so that the states
// never leave the SM. grid (Dv/64 slices, Hk, B x segments), 4 warps. A CTA
// owns the fp32 slice S[:, 64 slice] of its kv head's state ([Dk][64], warp
// w its rows [w Dk/4, + Dk/4)) and, per 64-row chunk in order and per query
// head of the group,
//     o = (φQ S' + mask(φQ φKᵀ) V[:, slice]) / den        (S' = S in 16 bits)
// with the pass's own products and epilogue, then S += φKᵀ V[:, slice] (and
// the key sum z += Σ φk, which every slice keeps for its normalizer).
//
// Why: the walk and the pass each read k and v, and the walk writes a 16-bit
// record per chunk that the pass reads again (at 64k rows, 16 heads and
// 128 x 128: 0.54 GB written and read) — the forward's bytes fall from
// q, k, v, o + 2 (k, v) + 2 records to q, k, v, o once. The state's chain
// is still one CTA's: a grid that leaves SMs idle splits each sequence into
// segments (fused_forward_segments), whose sums the walk kernel's sums-only
// launch computes first (reading k and v of every segment but the last).
//
// The loads of the next kStages - 1 chunks (q, k and the slice of v) fly
// while one computes. Two barriers per item: the stage landed, then S' (and
// z) in shared memory and the transforms done.
#pragma once

#include "linear/linear_chunk_pass.cuh"

namespace cuflash::detail::linear {

constexpr int kFusedStages = 2;

template <typename T, int DR>
struct FusedStage {
  alignas(128) T a[kChunk * DR];     // φq of the item's query head
  alignas(128) T b[kChunk * DR];     // φk
  alignas(128) T vt[kChunk * kSlice];  // v's slice
};

template <typename T, int DR, int kStages>
struct FusedSmem {
  // S' of the chunk, laid out as load_chunk_state_async lays a record's slice
  // out ([DR][64]), so that the pass's state product reads it unchanged.
  alignas(128) T s[DR * kSlice];
  float vec[DR];        // the key sum z at the chunk's start (normalize)
  ChunkRowStats stats;  // the transforms' argument; the output's operands do not read it
  FusedStage<T, DR> stages[kStages];
};

// Warp w's rows of the CTA's state slice: [w DR/4, + DR/4) as DR/64 m16
// tiles of 8 n8 tiles (the slice's 64 columns); acc index mt * 8 + nt.
template <int DR>
struct FusedStatePart {
  static constexpr int kRowTiles = DR / 64;
  static constexpr int kTiles = kRowTiles * 8;
  int row0;
  __device__ __forceinline__ FusedStatePart() : row0(threadIdx.x / 32 * (DR / 4)) {}
  __device__ __forceinline__ int row(int tile, int half) const {
    return row0 + tile / 8 * 16 + threadIdx.x % 32 / 4 + half * 8;
  }
  __device__ __forceinline__ int col(int tile) const { return acc_col(tile % 8, 0); }
};

// f(lo, hi, row, col) for each two adjacent elements (columns col, col + 1) of the part.
template <int DR, typename F>
__device__ __forceinline__ void for_each_state_pair(const FusedStatePart<DR>& part,
                                                    float (&acc)[FusedStatePart<DR>::kTiles][4], F f) {
#pragma unroll
  for (int tile = 0; tile < FusedStatePart<DR>::kTiles; ++tile)
#pragma unroll
    for (int half = 0; half < 2; ++half)
      f(acc[tile][2 * half], acc[tile][2 * half + 1], part.row(tile, half), part.col(tile));
}

template <typename T, int DR, int kStages>
__global__ void __launch_bounds__(kChunkThreads, 2) linear_fused_forward_kernel(LinearParams p, ChunkWorkspace w,
                                                                                WalkSegments segments) {
  constexpr PassRoles kRoles = pass_roles(Pass::output);
  static_assert(of_key_dim(kRoles.a) && of_key_dim(kRoles.b) && !kRoles.key_side, "the output pass's roles");
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<FusedSmem<T, DR, kStages>*>(smem_bytes);
  ChunkPlace at;
  at.slice = blockIdx.x;
  at.hk = blockIdx.y;
  at.b = blockIdx.z / segments.count;
  const int segment = blockIdx.z % segments.count;
  at.span = sequence_span(p, at.b);
  const int col0 = at.slice * kSlice;
  const ChunkItems items(at.span, p.group, /*in_reverse=*/false, segment, segments.count);
  const int item_count = items.count();
  auto issue = [&](int item) {
    if (item < item_count) {
      const int first = items.chunk(item) * kChunk, count = min(kChunk, at.span.length - first);
      FusedStage<T, DR>& stage = smem.stages[item % kStages];
      load_operand_async<DR>(stage.a, p, kRoles.a, at.b, at.span, first, count, at.hk * p.group + items.head(item), 0);
      load_operand_async<DR>(stage.b, p, kRoles.b, at.b, at.span, first, count, at.hk, 0);
      load_operand_async<kSlice>(stage.vt, p, kRoles.vt, at.b, at.span, first, count, at.hk, col0);
    }
    sm80::cp_async_commit();  // past the end an empty group: the count of groups in flight stays right
  };
  for (int s = 0; s + 1 < kStages; ++s) issue(s);

  // The running state: the call's initial state plus the sums of the segments before this one.
  const FusedStatePart<DR> part;
  float state[FusedStatePart<DR>::kTiles][4];
  for_each_state_pair(part, state, [&](float& lo, float& hi, int row, int col) {
    lo = hi = 0.0f;
    if (p.initial_state.data) {
      const float* start = p.initial_state.at(at.b, at.hk, row) + col0 + col;  // any strides: no float2
      lo = start[0];
      hi = start[1];
    }
  });
  // One segment at a time, its loads for the whole part together: one L2
  // round trip per segment (not per element).
  for (int other = 0; other < segment; ++other)
    for_each_state_pair(part, state, [&](float& lo, float& hi, int row, int col) {
      const float2 sum = *reinterpret_cast<const float2*>(
          segment_sum_row(p, w, at.b, other, segments.count, at.hk, row) + col0 + col);
      lo += sum.x;
      hi += sum.y;
    });
  // Key sum column threadIdx.x (every slice: its normalizer reads all of z).
  const bool keeps_key_sum = p.normalize && threadIdx.x < DR;
  float key_sum = 0.0f;
  if (keeps_key_sum) {
    if (p.initial_key_sum.data) key_sum = p.initial_key_sum.at(at.b, at.hk, 0)[threadIdx.x];
    for (int other = 0; other < segment; ++other)
      key_sum += segment_key_sum(p, w, at.b, other, segments.count, at.hk)[threadIdx.x];
  }

  const bool tiles_transformed = transformed_in_tile(p, kRoles.a) || transformed_in_tile(p, kRoles.b);
  const float a_multiplier = operand_multiplier(p, kRoles.a);
  const float score_multiplier = operand_multiplier(p, kRoles.b) * operand_multiplier(p, kRoles.vt);
  const float b_multiplier = operand_multiplier(p, kRoles.b);
  for (int item = 0; item < item_count; ++item) {
    FusedStage<T, DR>& stage = smem.stages[item % kStages];
    const int g = items.head(item), h = at.hk * p.group + g;
    at.first = items.chunk(item) * kChunk;
    at.count = min(kChunk, at.span.length - at.first);
    sm80::cp_async_wait<kStages - 2>();
    // The item's tiles landed; every thread is done with the previous item:
    // its stage (which the issue overwrites), S' and z.
    __syncthreads();
    issue(item + kStages - 1);
    if (g == 0) {  // the chunk's first head: S' and z of its start
      for_each_state_pair(part, state, [&](float lo, float hi, int row, int col) {
        *reinterpret_cast<std::uint32_t*>(smem.s + tile_index<kSlice>(row, col)) = sm80::pack2<T>(lo, hi);
      });
      if (keeps_key_sum) smem.vec[threadIdx.x] = key_sum;
    }
    transform_operand<DR>(stage.a, p, kRoles.a, at.count, smem.stats);
    transform_operand<DR>(stage.b, p, kRoles.b, at.count, smem.stats);
    if (g == 0 || tiles_transformed) __syncthreads();

    const ItemTiles<T> tiles{stage.a, stage.b, stage.vt};
    float out[8][4];
    float row_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[nt][e] = 0.0f;
    accumulate_chunk_pairs<T, DR, Pass::output>(out, row_sum, tiles, smem.stats, score_multiplier);
    accumulate_state_product<DR, /*kOverValues=*/false>(out, tiles.a, smem.s);
    apply_a_multiplier(out, row_sum, a_multiplier);
    store_pass_rows<T, DR, Pass::output>(p, w, at, h, out, row_sum, tiles.a, a_multiplier, smem);

    if (g + 1 == p.group) {  // the chunk's last head: its rows join the state
      accumulate_transposed_products<FusedStatePart<DR>::kRowTiles, 8, DR>(state, tiles.b, tiles.vt, part.row0, 0,
                                                                          b_multiplier);
      if (keeps_key_sum) key_sum += column_sum<DR>(tiles.b, threadIdx.x, at.count, [](int) { return 1.0f; });
    }
  }

  // The last segment's CTAs hold the total.
  if (segment + 1 < segments.count) return;
  if (p.final_state.data)
    for_each_state_pair(part, state, [&](float lo, float hi, int row, int col) {
      float* total = p.final_state.at(at.b, at.hk, row) + col0 + col;
      total[0] = lo;
      total[1] = hi;
    });
  if (keeps_key_sum && at.slice == 0 && p.final_key_sum.data)
    p.final_key_sum.at(at.b, at.hk, 0)[threadIdx.x] = key_sum;
}

}  // namespace cuflash::detail::linear
