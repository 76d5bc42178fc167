// The per-block pass of the chunked linear-attention kernels: the forward's
// output and the backward's row statistics, dq, dv and dk are one kernel,
// whose roles (linear_chunk_operands.cuh) say which tensors fill its tiles.
// grid (blocks x Vt slices, Hk, B), 4 warps. A CTA loads S' (its slice of the
// state at its block's boundary, from the records that linear_chunk_state.cuh
// scanned; non-causal the sequence's total) into fp32 registers, keeps a
// 16-bit copy in shared memory for the tensor cores, and runs the block's
// chunks (key side: in reverse), per chunk and query head
//     out = A S' + mask(A Bᵀ) Vt
// then S' += Bᵀ Vt and the copy is refreshed. Non-causal: out = A S' with
// the total, no intra-chunk part and no update.
//   output:    o = out / den (normalize: den = φq·z + the masked row sum + eps)
//   row_stats: den and dout · out (the normalized backward's RowStats)
//   dq:        scale φ'(q) ⊙ (out - δ_t z) / den_t  (the scores minus δ_t)
//   dv:        out, summed over the group
//   dk:        φ'(k) ⊙ (out + g), out summed over the group (the scores minus δ_t)
// (z, g: the key sum and its gradient; without normalize den = 1, δ = 0.)
#pragma once

#include "linear/linear_chunk_state.cuh"

namespace cuflash::detail::linear {

template <typename T, int DR>
struct PassSmem {
  alignas(128) T a[kChunk * DR];
  alignas(128) T b[kChunk * DR];
  alignas(128) T vt[kChunk * kSlice];
  alignas(128) T s[DR * kSlice];  // 16-bit copy of S'
  // The key sum's part (normalize): output and row_stats z over A's columns
  // (Dk), dq z and dk g over the output's 64 columns.
  float vec[DR];
  ChunkRowStats stats;  // of the query head whose dout or φq/den is in a tile
};

// How a pass uses the key sum (and its gradient) with normalize.
enum class VectorUse {
  none,
  normalizer,  // den_t = A_t · vec + the masked row sum + eps; vec += Σ rows of B
  rank_one,    // out[t][c] += weight_t · vec[c]; vec += Σ_t weight_t Vt[t]
};

constexpr VectorUse vector_use(Pass pass) {
  switch (pass) {
    case Pass::output:
    case Pass::row_stats: return VectorUse::normalizer;
    case Pass::dv: return VectorUse::none;
    default: return VectorUse::rank_one;
  }
}

// S' from a record [Dk][Dv]: S'[i][j] = record[i][64 slice + j], or with a
// contraction over Dv (A of dout or v: dq, dk) S'[j][i] = record[64 slice + i][j].
template <int DR, bool kOverValues>
__device__ __forceinline__ void load_state_slice(float (&state)[DR / 64][8][4], const float* record, int value_dim,
                                                 int slice) {
  for_each_state_pair<DR>(state, [&](float& lo, float& hi, int row, int col) {
    col += slice * kSlice;
    if constexpr (kOverValues) {
      lo = record[static_cast<std::int64_t>(col) * value_dim + row];
      hi = record[static_cast<std::int64_t>(col + 1) * value_dim + row];
    } else {
      const float2 pair = *reinterpret_cast<const float2*>(record + static_cast<std::int64_t>(row) * value_dim + col);
      lo = pair.x;
      hi = pair.y;
    }
  });
}

// den_t of the warp's rows (half 0: lane/4, half 1: lane/4 + 8) =
// A_t · z + the masked row sum + eps: the quad's four lanes split DR.
template <int DR, typename T>
__device__ __forceinline__ void row_normalizers(float (&den)[2], const T* a_tile, const float* z,
                                                const float (&row_sum)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = chunk_row(2 * half);
    float part = 0.0f;
    for (int col = lane % 4; col < DR; col += 4) part += to_float(a_tile[tile_index<DR>(row, col)]) * z[col];
    part += row_sum[half];
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    part += __shfl_xor_sync(0xffffffffu, part, 2);
    den[half] = part + 1e-10f;
  }
}

// Where a pass's chunk happens: which sequence rows and heads, and which slice.
struct ChunkPlace {
  int b, hk, slice;
  SequenceSpan span;
  int first, count;  // rows [first, first + count) of the sequence
};

// The masked scores P = mask(A Bᵀ) (minus δ on dout's side for dq and dk)
// and out += P Vt, for the warp's 16 rows; row_sum gets P's row sums.
template <typename T, int DR, Pass kPass>
__device__ __forceinline__ void accumulate_chunk_pairs(float (&out)[8][4], float (&row_sum)[2],
                                                       const PassSmem<T, DR>& smem) {
  constexpr bool kKeySide = pass_roles(kPass).key_side;
  const int warp = threadIdx.x / 32;
  // n-tile pairs (16 columns) with a kept column: key side from the warp's
  // first row on, query side up to its last.
  const int first_pair = kKeySide ? warp : 0, last_pair = kKeySide ? kChunk / 16 : warp + 1;
  float scores[8][4];
  chunk_scores<DR>(scores, smem.a, smem.b, first_pair, last_pair);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = chunk_row(e), col = acc_col(nt, e);
      const bool in_pairs = nt / 2 >= first_pair && nt / 2 < last_pair;
      const bool kept = in_pairs && (kKeySide ? col >= row : col <= row);
      float x = scores[nt][e];
      if constexpr (kPass == Pass::dq) x += smem.stats.minus_delta[row];
      if constexpr (kPass == Pass::dk) x += smem.stats.minus_delta[col];
      x = kept ? x : 0.0f;
      scores[nt][e] = x;
      row_sum[e / 2] += x;
    }
  accumulate_out<kChunk / 16>(out, smem.vt, first_pair, last_pair, [&](int kt, std::uint32_t(&a)[4]) {
    a[0] = sm80::pack2<T>(scores[2 * kt][0], scores[2 * kt][1]);
    a[1] = sm80::pack2<T>(scores[2 * kt][2], scores[2 * kt][3]);
    a[2] = sm80::pack2<T>(scores[2 * kt + 1][0], scores[2 * kt + 1][1]);
    a[3] = sm80::pack2<T>(scores[2 * kt + 1][2], scores[2 * kt + 1][3]);
  });
}

// out += A S' (the 16-bit copy) for the warp's 16 rows.
template <typename T, int DR>
__device__ __forceinline__ void accumulate_state_product(float (&out)[8][4], const PassSmem<T, DR>& smem) {
  accumulate_out<DR / 16>(out, smem.s, 0, DR / 16,
                          [&](int kt, std::uint32_t(&a)[4]) { load_row_fragment<DR>(a, smem.a, kt); });
}

// row_stats' results for the warp's rows of the chunk: den_t (slice 0) and
// dout_t · num_t over the slice's columns (the quad's four lanes hold 16 each).
template <typename T>
__device__ __forceinline__ void store_row_stats(const LinearParams& p, const ChunkWorkspace& w, const ChunkPlace& at,
                                                int h, const float (&out)[8][4], const float (&den)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = chunk_row(2 * half);
    float dot = 0.0f;
    if (row < at.count) {
      const T* dout_row = row_pointer<const T>(p.dout, at.b, at.span, at.first + row, h) + at.slice * kSlice;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const float2 d = unpack2<T>(*reinterpret_cast<const std::uint32_t*>(dout_row + acc_col(nt, 0)));
        dot += out[nt][2 * half] * d.x + out[nt][2 * half + 1] * d.y;
      }
    }
    dot += __shfl_xor_sync(0xffffffffu, dot, 1);
    dot += __shfl_xor_sync(0xffffffffu, dot, 2);
    if (lane % 4 == 0 && row < at.count) {
      RowStats& stats = w.row_stats[row_stats_index(p, at.b, at.span, at.first + row, h)];
      if (at.slice == 0) stats.den = den[half];
      stats.dot[at.slice] = dot;
    }
  }
}

// The pass's results for the warp's rows of the chunk (query side: of query
// head h; key side: of the kv head, out summed over the group). Per output
// column c: multiplier · φ'(raw[c]) · (out + weight · vec[c]).
template <typename T, int DR, Pass kPass>
__device__ __forceinline__ void store_pass_rows(const LinearParams& p, const ChunkWorkspace& w, const ChunkPlace& at,
                                                int h, const float (&out)[8][4], const float (&row_sum)[2],
                                                const PassSmem<T, DR>& smem) {
  const int col0 = at.slice * kSlice;
  float den[2] = {1.0f, 1.0f};
  if constexpr (vector_use(kPass) == VectorUse::normalizer)
    if (p.normalize) row_normalizers<DR>(den, smem.a, smem.vec, row_sum);
  if constexpr (kPass == Pass::row_stats) {
    store_row_stats<T>(p, w, at, h, out, den);
  } else {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = chunk_row(2 * half);
      if (row >= at.count) continue;
      const int t = at.first + row;
      float multiplier = 1.0f, weight = 0.0f;
      const T* raw = nullptr;  // the input whose φ' the result takes
      T* result = nullptr;
      if constexpr (kPass == Pass::output) {
        multiplier = p.normalize ? 1.0f / den[half] : 1.0f;
        result = row_pointer<T>(p.out, at.b, at.span, t, h);
      } else if constexpr (kPass == Pass::dq) {
        multiplier = p.scale * smem.stats.inv_den[row];
        weight = p.normalize ? smem.stats.minus_delta[row] : 0.0f;
        raw = row_pointer<const T>(p.q, at.b, at.span, t, h);
        result = row_pointer<T>(p.dq, at.b, at.span, t, h);
      } else if constexpr (kPass == Pass::dv) {
        result = row_pointer<T>(p.dv, at.b, at.span, t, at.hk);
      } else {
        weight = p.normalize ? 1.0f : 0.0f;
        raw = row_pointer<const T>(p.k, at.b, at.span, t, at.hk);
        result = row_pointer<T>(p.dk, at.b, at.span, t, at.hk);
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int col = acc_col(nt, 0);
        float x0 = out[nt][2 * half], x1 = out[nt][2 * half + 1];
        if (weight != 0.0f) {
          x0 += weight * smem.vec[col];
          x1 += weight * smem.vec[col + 1];
        }
        x0 *= multiplier;
        x1 *= multiplier;
        if (raw != nullptr) {
          const float2 x = unpack2<T>(*reinterpret_cast<const std::uint32_t*>(raw + col0 + col));
          x0 *= feature_derivative(p.map, x.x);
          x1 *= feature_derivative(p.map, x.y);
        }
        *reinterpret_cast<std::uint32_t*>(result + col0 + col) = sm80::pack2<T>(x0, x1);
      }
    }
  }
}

// At least one CTA per SM, said outright: without it ptxas for sm_90a caps
// the dq pass at 168 registers (three CTAs per SM) and spills.
template <typename T, int DR, Pass kPass>
__global__ void __launch_bounds__(kChunkThreads, 1) linear_chunk_pass_kernel(LinearParams p, ChunkWorkspace w) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  constexpr VectorUse kVector = vector_use(kPass);
  // B and Vt of the query side are k and v (no statistics); the key side's
  // and dq's tiles meet dout.
  constexpr bool kWithStats = kRoles.key_side || kPass == Pass::dq;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<PassSmem<T, DR>*>(smem_bytes);
  const int slices = operand_width(p, kRoles.vt) / kSlice;
  ChunkPlace at;
  const int block = blockIdx.x / slices;
  at.slice = blockIdx.x % slices;
  at.hk = blockIdx.y;
  at.b = blockIdx.z;
  at.span = sequence_span(p, at.b);
  const int block_first = block * kBlockRows;
  if (block_first >= at.span.length) return;

  const float* record = block_record(p, w, at.b, at.span, block, at.hk);
  float state[DR / 64][8][4];
  load_state_slice<DR, !of_key_dim(kRoles.a)>(state, record, p.value_dim, at.slice);
  store_state_copy<DR>(state, smem.s);
  const float* key_sum = record + static_cast<std::int64_t>(p.key_dim) * p.value_dim;
  if constexpr (kVector == VectorUse::normalizer) {
    if (p.normalize)
      for (int i = threadIdx.x; i < DR; i += kChunkThreads) smem.vec[i] = key_sum[i];
  } else if constexpr (kVector == VectorUse::rank_one) {
    if (p.normalize && threadIdx.x < kSlice) smem.vec[threadIdx.x] = key_sum[at.slice * kSlice + threadIdx.x];
  }
  // (The loop's first barrier orders these stores before their readers.)

  for (int step = 0; step < kBlockChunks; ++step) {
    const int chunk = kRoles.key_side ? kBlockChunks - 1 - step : step;
    at.first = block_first + chunk * kChunk;
    if (at.first >= at.span.length) continue;
    at.count = min(kChunk, at.span.length - at.first);

    if constexpr (!kRoles.key_side) {
      if (p.causal) {
        __syncthreads();  // the previous chunk's readers are done with b and vt
        load_operand_async<DR>(smem.b, p, kRoles.b, at.b, at.span, at.first, at.count, at.hk, 0);
        load_operand_async<kSlice>(smem.vt, p, kRoles.vt, at.b, at.span, at.first, at.count, at.hk,
                                   at.slice * kSlice);
        sm80::cp_async_wait<0>();
        __syncthreads();
        transform_operand<DR>(smem.b, p, kRoles.b, at.count, smem.stats);
        transform_operand<kSlice>(smem.vt, p, kRoles.vt, at.count, smem.stats);
      }
      for (int g = 0; g < p.group; ++g) {
        const int h = at.hk * p.group + g;
        __syncthreads();  // the previous head's readers are done with a and stats
        load_operand_async<DR>(smem.a, p, kRoles.a, at.b, at.span, at.first, at.count, h, 0);
        if constexpr (kWithStats) load_chunk_row_stats(smem.stats, p, w.row_stats, at.b, at.span, at.first, at.count, h);
        sm80::cp_async_wait<0>();
        __syncthreads();
        transform_operand<DR>(smem.a, p, kRoles.a, at.count, smem.stats);
        __syncthreads();
        float out[8][4] = {};
        float row_sum[2] = {0.0f, 0.0f};
        if (p.causal) accumulate_chunk_pairs<T, DR, kPass>(out, row_sum, smem);
        accumulate_state_product(out, smem);
        store_pass_rows<T, DR, kPass>(p, w, at, h, out, row_sum, smem);
      }
      if (!p.causal) continue;
      // The chunk joins the state: S' += Bᵀ Vt (fp32), and the key sum; then the 16-bit copy.
      accumulate_state<DR>(state, smem.b, smem.vt);
      float vec_add = 0.0f;
      if constexpr (kVector == VectorUse::normalizer) {
        if (p.normalize && threadIdx.x < DR)
          vec_add = column_sum<DR>(smem.b, threadIdx.x, at.count, [](int) { return 1.0f; });
      } else {
        if (p.normalize && threadIdx.x < kSlice)
          vec_add = column_sum<kSlice>(smem.vt, threadIdx.x, at.count, [](int) { return 1.0f; });
      }
      __syncthreads();  // every warp is done reading s and vec
      store_state_copy<DR>(state, smem.s);
      if (p.normalize && threadIdx.x < (kVector == VectorUse::normalizer ? DR : kSlice)) smem.vec[threadIdx.x] += vec_add;
    } else {
      __syncthreads();  // the previous chunk's readers are done with a
      load_operand_async<DR>(smem.a, p, kRoles.a, at.b, at.span, at.first, at.count, at.hk, 0);
      sm80::cp_async_wait<0>();
      __syncthreads();
      transform_operand<DR>(smem.a, p, kRoles.a, at.count, smem.stats);
      float out[8][4] = {};
      float row_sum[2] = {0.0f, 0.0f};
      float vec_add = 0.0f;  // dk: column threadIdx.x of Σ_h Σ_t -δ_t φq_t/den_t, joins g after the rows
      if (p.causal) {
        for (int g = 0; g < p.group; ++g) {
          const int h = at.hk * p.group + g;
          __syncthreads();  // the previous head's readers are done with b, vt and stats (and a is transformed)
          load_operand_async<DR>(smem.b, p, kRoles.b, at.b, at.span, at.first, at.count, h, 0);
          load_operand_async<kSlice>(smem.vt, p, kRoles.vt, at.b, at.span, at.first, at.count, h,
                                     at.slice * kSlice);
          load_chunk_row_stats(smem.stats, p, w.row_stats, at.b, at.span, at.first, at.count, h);
          sm80::cp_async_wait<0>();
          __syncthreads();
          transform_operand<DR>(smem.b, p, kRoles.b, at.count, smem.stats);
          transform_operand<kSlice>(smem.vt, p, kRoles.vt, at.count, smem.stats);
          __syncthreads();
          accumulate_chunk_pairs<T, DR, kPass>(out, row_sum, smem);
          // S' holds the rows after this chunk until its copy is refreshed below.
          accumulate_state<DR>(state, smem.b, smem.vt);
          if constexpr (kVector == VectorUse::rank_one)
            if (p.normalize && threadIdx.x < kSlice)
              vec_add += column_sum<kSlice>(smem.vt, threadIdx.x, at.count,
                                            [&](int r) { return smem.stats.minus_delta[r]; });
        }
      }
      __syncthreads();  // a is transformed
      accumulate_state_product(out, smem);
      store_pass_rows<T, DR, kPass>(p, w, at, at.hk, out, row_sum, smem);
      if (!p.causal) continue;
      __syncthreads();  // every warp is done reading s and vec
      store_state_copy<DR>(state, smem.s);
      if constexpr (kVector == VectorUse::rank_one)
        if (p.normalize && threadIdx.x < kSlice) smem.vec[threadIdx.x] += vec_add;
    }
  }
}

}  // namespace cuflash::detail::linear
