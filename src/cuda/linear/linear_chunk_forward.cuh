// The chunked forward of linear attention on tensor cores, three launches:
//  1. block_state:  grid (blocks x Dv slices, Hk, B). Each CTA sums one block's
//     (kBlockRows rows, 4 chunks) φKᵀV [Dk x 64] (and, in slice 0, Σ φk) into
//     its fp32 record of the workspace. All blocks of all heads in parallel.
//  2. state_scan:   grid (record elements / 256, Hk, B). Per element, a
//     sequential exclusive scan over the sequence's blocks in place: a record
//     becomes the state (and key sum) at its block's start; the total goes to
//     final_state / final_key_sum and, non-causal, to the totals record.
//  3. block_output: grid as 1. A CTA loads its block's starting state slice
//     (fp32, kept in registers) and runs the block's chunks in order: per query
//     head of the group, O = φQ S + tril(φQ φKᵀ) V (÷ (φQ z + rowsum + eps)),
//     then S += φKᵀ V. Non-causal: O = φQ S_total, no intra-chunk part.
// A block's record lives at slot(b, block) = first_row(b) / kBlockRows + b + block
// (an upper bound of the blocks before it), so no table of offsets is needed.
#pragma once

#include "linear/linear_chunk_tiles.cuh"

namespace cuflash::detail::linear {

struct ChunkWorkspace {
  float* records;  // [slots][Hk][Dk * Dv + Dk]: block sums, then block-start states
  float* totals;   // [B][Hk][Dk * Dv + Dk]: non-causal, the whole sequence's
};

__device__ __forceinline__ std::int64_t block_slot(const LinearParams& p, int b, const SequenceSpan& span, int block) {
  const std::int64_t first = p.cu_seqlens ? span.first : static_cast<std::int64_t>(b) * p.seq_len;
  return first / kBlockRows + b + block;
}

__device__ __forceinline__ std::int64_t record_floats(const LinearParams& p) {
  return static_cast<std::int64_t>(p.key_dim) * p.value_dim + p.key_dim;
}

template <typename T, int DK>
struct ChunkSmem {
  alignas(128) T q[kChunk * DK];
  alignas(128) T k[kChunk * DK];
  alignas(128) T v[kChunk * kSlice];
  alignas(128) T s[DK * kSlice];  // 16-bit copy of the state slice
  float z[DK];
};

template <typename T, int DK>
__global__ void __launch_bounds__(kChunkThreads) linear_block_state_kernel(LinearParams p, ChunkWorkspace w) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<ChunkSmem<T, DK>*>(smem_bytes);
  const int slices = p.value_dim / kSlice;
  const int block = blockIdx.x / slices, slice = blockIdx.x % slices;
  const int hk = blockIdx.y, b = blockIdx.z;
  const SequenceSpan span = sequence_span(p, b);
  const int block_first = block * kBlockRows;
  if (block_first >= span.length) return;

  float acc[DK / 64][8][4] = {};
  float z_part = 0.0f;  // column threadIdx.x of Σ φk (slice 0)
  for (int c = 0; c < kBlockChunks; ++c) {
    const int first = block_first + c * kChunk;
    if (first >= span.length) break;
    const int count = min(kChunk, span.length - first);
    load_tile_async<DK>(smem.k, row_pointer<const T>(p.k, b, span, first, hk), p.k.row_stride, count);
    load_tile_async<kSlice>(smem.v, row_pointer<const T>(p.v, b, span, first, hk) + slice * kSlice, p.v.row_stride,
                            count);
    sm80::cp_async_wait<0>();
    __syncthreads();
    apply_feature_map<DK>(smem.k, p.map, 1.0f, count);
    __syncthreads();
    if (slice == 0 && threadIdx.x < DK)
      for (int row = 0; row < count; ++row) z_part += to_float(smem.k[tile_index<DK>(row, threadIdx.x)]);
    accumulate_state<DK>(acc, smem.k, smem.v);
    __syncthreads();  // before the next chunk overwrites the tiles
  }
  float* record = w.records + (block_slot(p, b, span, block) * p.heads_kv + hk) * record_floats(p);
#pragma unroll
  for (int mt = 0; mt < DK / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = state_row<DK>(mt, 2 * half), col = slice * kSlice + acc_col(nt, 0);
        *reinterpret_cast<float2*>(record + row * p.value_dim + col) =
            make_float2(acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
      }
  if (slice == 0 && threadIdx.x < DK) record[static_cast<std::int64_t>(DK) * p.value_dim + threadIdx.x] = z_part;
}

constexpr int kScanThreads = 256;

// One thread per record element (state, then key sum): block sums -> block-start states.
__global__ void __launch_bounds__(kScanThreads) linear_state_scan_kernel(LinearParams p, ChunkWorkspace w) {
  const int hk = blockIdx.y, b = blockIdx.z;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kScanThreads + threadIdx.x;
  const int state_floats = p.key_dim * p.value_dim;
  const bool is_state = e < state_floats;
  if (!is_state && (!p.normalize || e >= record_floats(p))) return;
  const int i = is_state ? static_cast<int>(e / p.value_dim) : static_cast<int>(e - state_floats);
  const int j = is_state ? static_cast<int>(e % p.value_dim) : 0;
  // Element (i, j) of a state, element i of a key sum.
  auto element = [&](const StateView& view) { return is_state ? view.at(b, hk, i) + j : view.at(b, hk, 0) + i; };
  const StateView& initial = is_state ? p.initial_state : p.initial_key_sum;
  float running = initial.data ? *element(initial) : 0.0f;
  const SequenceSpan span = sequence_span(p, b);
  const int blocks = (span.length + kBlockRows - 1) / kBlockRows;
  const std::int64_t stride = static_cast<std::int64_t>(p.heads_kv) * record_floats(p);
  float* at = w.records + (block_slot(p, b, span, 0) * p.heads_kv + hk) * record_floats(p) + e;
  // Eight loads in flight before the stores (which the compiler may not move
  // above loads of the same array): the scan is bound by memory latency.
  constexpr int kBatch = 8;
  for (int block = 0; block < blocks; block += kBatch) {
    float sums[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) sums[u] = block + u < blocks ? at[(block + u) * stride] : 0.0f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (p.causal && block + u < blocks) at[(block + u) * stride] = running;
      running += sums[u];
    }
  }
  const StateView& final_view = is_state ? p.final_state : p.final_key_sum;
  if (final_view.data) *element(final_view) = running;
  if (!p.causal) w.totals[(static_cast<std::int64_t>(b) * p.heads_kv + hk) * record_floats(p) + e] = running;
}

template <typename T, int DK>
__global__ void __launch_bounds__(kChunkThreads) linear_block_output_kernel(LinearParams p, ChunkWorkspace w) {
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<ChunkSmem<T, DK>*>(smem_bytes);
  const int slices = p.value_dim / kSlice;
  const int block = blockIdx.x / slices, slice = blockIdx.x % slices;
  const int hk = blockIdx.y, b = blockIdx.z;
  const SequenceSpan span = sequence_span(p, b);
  const int block_first = block * kBlockRows;
  if (block_first >= span.length) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The state slice at the block's start (causal) or the sequence's total.
  const float* record = p.causal
                            ? w.records + (block_slot(p, b, span, block) * p.heads_kv + hk) * record_floats(p)
                            : w.totals + (static_cast<std::int64_t>(b) * p.heads_kv + hk) * record_floats(p);
  float state[DK / 64][8][4];
#pragma unroll
  for (int mt = 0; mt < DK / 64; ++mt)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = state_row<DK>(mt, 2 * half), col = slice * kSlice + acc_col(nt, 0);
        const float2 pair = *reinterpret_cast<const float2*>(record + row * p.value_dim + col);
        state[mt][nt][2 * half] = pair.x;
        state[mt][nt][2 * half + 1] = pair.y;
      }
  store_state_copy<DK>(state, smem.s);
  if (p.normalize && threadIdx.x < DK) smem.z[threadIdx.x] = record[static_cast<std::int64_t>(DK) * p.value_dim + threadIdx.x];

  for (int c = 0; c < kBlockChunks; ++c) {
    const int first = block_first + c * kChunk;
    if (first >= span.length) break;
    const int count = min(kChunk, span.length - first);
    if (p.causal) {
      load_tile_async<DK>(smem.k, row_pointer<const T>(p.k, b, span, first, hk), p.k.row_stride, count);
      load_tile_async<kSlice>(smem.v, row_pointer<const T>(p.v, b, span, first, hk) + slice * kSlice,
                              p.v.row_stride, count);
      sm80::cp_async_wait<0>();
      __syncthreads();
      apply_feature_map<DK>(smem.k, p.map, 1.0f, count);
    }
    for (int g = 0; g < p.group; ++g) {
      const int h = hk * p.group + g;
      __syncthreads();  // the previous head's readers are done with q
      load_tile_async<DK>(smem.q, row_pointer<const T>(p.q, b, span, first, h), p.q.row_stride, count);
      sm80::cp_async_wait<0>();
      __syncthreads();
      apply_feature_map<DK>(smem.q, p.map, p.scale, count);
      __syncthreads();

      float out[8][4] = {};
      float row_sum[2] = {0.0f, 0.0f};  // rows lane/4 and lane/4 + 8 of the warp: Σ_{s<=t} scores
      if (p.causal) {
        float scores[8][4];
        // Keys up to the warp's last row: n-tile pairs [0, warp].
        chunk_scores<DK>(scores, smem.q, smem.k, warp + 1);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = warp * 16 + lane / 4 + (e >= 2 ? 8 : 0), col = acc_col(nt, e);
            const float x = (nt < 2 * (warp + 1) && col <= row) ? scores[nt][e] : 0.0f;
            scores[nt][e] = x;
            row_sum[e / 2] += x;
          }
        accumulate_out<kChunk / 16>(out, smem.v, warp + 1, [&](int kt, std::uint32_t(&a)[4]) {
          a[0] = sm80::pack2<T>(scores[2 * kt][0], scores[2 * kt][1]);
          a[1] = sm80::pack2<T>(scores[2 * kt][2], scores[2 * kt][3]);
          a[2] = sm80::pack2<T>(scores[2 * kt + 1][0], scores[2 * kt + 1][1]);
          a[3] = sm80::pack2<T>(scores[2 * kt + 1][2], scores[2 * kt + 1][3]);
        });
      }
      accumulate_out<DK / 16>(out, smem.s, DK / 16,
                     [&](int kt, std::uint32_t(&a)[4]) { load_query_fragment<DK>(a, smem.q, kt); });

      float den[2] = {1.0f, 1.0f};
      if (p.normalize) {
        // φq_t · z: the quad's four lanes split Dk, then sum across the quad.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = warp * 16 + lane / 4 + 8 * half;
          float part = 0.0f;
          for (int col = lane % 4; col < DK; col += 4) part += to_float(smem.q[tile_index<DK>(row, col)]) * smem.z[col];
          part += row_sum[half];
          part += __shfl_xor_sync(0xffffffffu, part, 1);
          part += __shfl_xor_sync(0xffffffffu, part, 2);
          den[half] = part + 1e-10f;
        }
      }
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp * 16 + lane / 4 + 8 * half;
        if (row >= count) continue;
        T* out_row = row_pointer<T>(p.out, b, span, first + row, h) + slice * kSlice;
        const float inverse = p.normalize ? 1.0f / den[half] : 1.0f;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
          *reinterpret_cast<std::uint32_t*>(out_row + acc_col(nt, 0)) =
              sm80::pack2<T>(out[nt][2 * half] * inverse, out[nt][2 * half + 1] * inverse);
      }
    }
    if (!p.causal) continue;
    // The chunk joins the state: S += φKᵀ V (fp32), z += Σ φk; then the 16-bit copy.
    accumulate_state<DK>(state, smem.k, smem.v);
    float z_add = 0.0f;
    if (p.normalize && threadIdx.x < DK)
      for (int row = 0; row < count; ++row) z_add += to_float(smem.k[tile_index<DK>(row, threadIdx.x)]);
    __syncthreads();  // every warp is done reading s, z, k and v
    store_state_copy<DK>(state, smem.s);
    if (p.normalize && threadIdx.x < DK) smem.z[threadIdx.x] += z_add;
  }
}

}  // namespace cuflash::detail::linear
