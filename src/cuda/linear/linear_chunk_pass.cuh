// The per-chunk pass of the chunked linear-attention kernels: the forward's
// output and the backward's row statistics, dq, dv and dk are one kernel,
// whose roles (linear_chunk_operands.cuh) say which tensors fill its tiles.
// grid (chunks x Vt slices, Hk, B), 4 warps. A CTA loads S' (its slice of
// the chunk's 16-bit state record, which the walk of linear_chunk_state.cuh
// wrote; non-causal the sequence's total) into shared memory and, per query
// head of the kv head's group,
//     out = A S' + mask(A Bᵀ) Vt
// (non-causal: out = A S', no intra-chunk part). It carries no state, so
// every CTA is independent of the others.
//   output:    o = out / den (normalize: den = φq·z + the masked row sum + eps)
//   row_stats: den and dout · out (the normalized backward's RowStats)
//   dq:        scale φ'(q) ⊙ (out - δ_t z) / den_t  (the scores minus δ_t)
//   dv:        out, summed over the group
//   dk:        φ'(k) ⊙ (out + g), out summed over the group (the scores minus δ_t)
// (z, g: the key sum and its gradient; without normalize den = 1, δ = 0.)
#pragma once

#include <cstddef>

#include "linear/linear_chunk_state.cuh"

namespace cuflash::detail::linear {

template <typename T, int DR>
struct PassTiles {
  alignas(128) T a[kChunk * DR];
  alignas(128) T b[kChunk * DR];
  alignas(128) T vt[kChunk * kSlice];
  RowStats raw_stats[kChunk];
};

template <typename T, int DR>
struct PassSmem {
  // S' as the products read it: a 64-column slice of the record, [DR][64];
  // or, contracted over Dv (A of dout or v: dq, dk), a 64-row slice, [64][DR],
  // whose transpose is S'.
  alignas(128) T s[DR * kSlice];
  // The key sum's part (normalize): output and row_stats z over A's columns
  // (Dk), dq z and dk g over the output's 64 columns.
  float vec[DR];
  ChunkRowStats stats;  // of the query head whose dout or φq/den is in a tile
  // Two sets when a CTA runs several query heads (GQA): head i + 1's loads
  // land in one while head i computes on the other. With one head only the
  // first is part of the launch's shared memory (pass_smem_bytes).
  PassTiles<T, DR> tiles[2];
};

template <typename T, int DR>
constexpr std::size_t pass_smem_bytes(bool two_sets) {
  // tiles is the last member, and PassTiles' size a multiple of its alignment.
  return sizeof(PassSmem<T, DR>) - (two_sets ? 0 : sizeof(PassTiles<T, DR>));
}

// The tiles one item computes on, one of each double-buffered set.
template <typename T>
struct ItemTiles {
  T* a;
  T* b;
  T* vt;
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

// S' of a chunk from its record [Dk][Dv] (cp.async, not committed): rows
// [0, DR) and columns [64 slice, + 64) into [DR][64], or contracted over Dv
// rows [64 slice, + 64) and all DR = Dv columns into [64][DR].
template <int DR, bool kOverValues, typename T>
__device__ __forceinline__ void load_chunk_state_async(T* s_tile, const T* record, int value_dim, int slice) {
  if constexpr (kOverValues) {
    load_tile_async<DR>(s_tile, record + static_cast<std::int64_t>(slice) * kSlice * value_dim, value_dim, kChunk);
  } else {
#pragma unroll
    for (int half = 0; half < DR / kChunk; ++half)
      load_tile_async<kSlice>(s_tile + half * kChunk * kSlice,
                              record + static_cast<std::int64_t>(half) * kChunk * value_dim + slice * kSlice,
                              value_dim, kChunk);
  }
}

// den_t of the warp's rows (half 0: lane/4, half 1: lane/4 + 8) =
// A_t · z + the masked row sum + eps: the quad's four lanes split DR.
// (a_multiplier: A's operand_multiplier; row_sum has it already.)
template <int DR, typename T>
__device__ __forceinline__ void row_normalizers(float (&den)[2], const T* a_tile, float a_multiplier, const float* z,
                                                const float (&row_sum)[2]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = chunk_row(2 * half);
    float part = 0.0f;
    for (int col = lane % 4; col < DR; col += 4) part += to_float(a_tile[tile_index<DR>(row, col)]) * z[col];
    part = a_multiplier * part + row_sum[half];
    part += __shfl_xor_sync(0xffffffffu, part, 1);
    part += __shfl_xor_sync(0xffffffffu, part, 2);
    den[half] = part + kLinearNormalizerEps;
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
// score_multiplier: B's and Vt's operand_multiplier (P Vt is linear in both).
template <typename T, int DR, Pass kPass>
__device__ __forceinline__ void accumulate_chunk_pairs(float (&out)[8][4], float (&row_sum)[2],
                                                       const ItemTiles<T>& tiles, const ChunkRowStats& stats,
                                                       float score_multiplier) {
  constexpr bool kKeySide = pass_roles(kPass).key_side;
  const int warp = threadIdx.x / 32;
  // n-tile pairs (16 columns) with a kept column: key side from the warp's
  // first row on, query side up to its last.
  const int first_pair = kKeySide ? warp : 0, last_pair = kKeySide ? kChunk / 16 : warp + 1;
  float scores[8][4];
  chunk_scores<DR>(scores, tiles.a, tiles.b, first_pair, last_pair);
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = chunk_row(e), col = acc_col(nt, e);
      const bool in_pairs = nt / 2 >= first_pair && nt / 2 < last_pair;
      const bool kept = in_pairs && (kKeySide ? col >= row : col <= row);
      float x = scores[nt][e];
      if constexpr (kPass == Pass::dq) x += stats.minus_delta[row];
      if constexpr (kPass == Pass::dk) x += stats.minus_delta[col];
      x = kept ? x * score_multiplier : 0.0f;
      scores[nt][e] = x;
      row_sum[e / 2] += x;
    }
  accumulate_out<kChunk / 16>(out, tiles.vt, first_pair, last_pair, [&](int kt, std::uint32_t(&a)[4]) {
    a[0] = sm80::pack2<T>(scores[2 * kt][0], scores[2 * kt][1]);
    a[1] = sm80::pack2<T>(scores[2 * kt][2], scores[2 * kt][3]);
    a[2] = sm80::pack2<T>(scores[2 * kt + 1][0], scores[2 * kt + 1][1]);
    a[3] = sm80::pack2<T>(scores[2 * kt + 1][2], scores[2 * kt + 1][3]);
  });
}

// out += A S' for the warp's 16 rows (s_tile as load_chunk_state_async laid it out).
template <int DR, bool kOverValues, typename T>
__device__ __forceinline__ void accumulate_state_product(float (&out)[8][4], const T* a_tile, const T* s_tile) {
  if constexpr (kOverValues) {
    accumulate_row_products<DR>(out, a_tile, s_tile, 0, kChunk / 16);
  } else {
    accumulate_out<DR / 16>(out, s_tile, 0, DR / 16,
                            [&](int kt, std::uint32_t(&a)[4]) { load_row_fragment<DR>(a, a_tile, kt); });
  }
}

// out and row_sum times A's operand_multiplier (an untransformed A's scale,
// which the products leave out).
__device__ __forceinline__ void apply_a_multiplier(float (&out)[8][4], float (&row_sum)[2], float a_multiplier) {
  if (a_multiplier == 1.0f) return;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) out[nt][e] *= a_multiplier;
  row_sum[0] *= a_multiplier;
  row_sum[1] *= a_multiplier;
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
      if (at.slice == 0) {
        // Every byte of the record is written (the loads copy it whole, 16 bytes).
        stats.den = den[half];
        stats.unused = 0.0f;
        if (p.value_dim <= kSlice) stats.dot[1] = 0.0f;
      }
      stats.dot[at.slice] = dot;
    }
  }
}

// The pass's results for the warp's rows of the chunk (query side: of query
// head h; key side: of the kv head, out summed over the group). Per output
// column c: multiplier · φ'(raw[c]) · (out + weight · vec[c]).
// (out and row_sum with A's multiplier applied.)
// (smem: a PassSmem or the fused forward's FusedSmem; its vec and stats.)
template <typename T, int DR, Pass kPass, typename Smem>
__device__ __forceinline__ void store_pass_rows(const LinearParams& p, const ChunkWorkspace& w, const ChunkPlace& at,
                                                int h, const float (&out)[8][4], const float (&row_sum)[2],
                                                const T* a_tile, float a_multiplier, const Smem& smem) {
  const int col0 = at.slice * kSlice;
  float den[2] = {1.0f, 1.0f};
  if constexpr (vector_use(kPass) == VectorUse::normalizer)
    if (p.normalize) row_normalizers<DR>(den, a_tile, a_multiplier, smem.vec, row_sum);
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
        if (raw != nullptr && p.map != Map::identity) {  // identity: φ' = 1, no read of the input
          const float2 x = unpack2<T>(*reinterpret_cast<const std::uint32_t*>(raw + col0 + col));
          x0 *= feature_derivative(p.map, x.x);
          x1 *= feature_derivative(p.map, x.y);
        }
        *reinterpret_cast<std::uint32_t*>(result + col0 + col) = sm80::pack2<T>(x0, x1);
      }
    }
  }
}

template <typename T, int DR, Pass kPass>
__global__ void __launch_bounds__(kChunkThreads) linear_chunk_pass_kernel(LinearParams p, ChunkWorkspace w) {
  constexpr PassRoles kRoles = pass_roles(kPass);
  constexpr VectorUse kVector = vector_use(kPass);
  constexpr bool kKeySide = kRoles.key_side;
  constexpr bool kOverValues = !of_key_dim(kRoles.a);
  // B and Vt of the query side are k and v (no statistics); the key side's
  // and dq's tiles meet dout.
  constexpr bool kWithStats = kKeySide || kPass == Pass::dq;
  extern __shared__ __align__(128) unsigned char smem_bytes[];
  auto& smem = *reinterpret_cast<PassSmem<T, DR>*>(smem_bytes);
  const int slices = operand_width(p, kRoles.vt) / kSlice;
  ChunkPlace at;
  const int chunk = blockIdx.x / slices;
  at.slice = blockIdx.x % slices;
  at.hk = blockIdx.y;
  at.b = blockIdx.z;
  at.span = sequence_span(p, at.b);
  at.first = chunk * kChunk;
  if (at.first >= at.span.length) return;
  at.count = min(kChunk, at.span.length - at.first);

  const std::int64_t slot = chunk_slot(p, at.b, at.span, p.causal ? chunk : 0);
  load_chunk_state_async<DR, kOverValues>(smem.s, state_record<T>(p, w, slot, at.hk), p.value_dim, at.slice);
  if constexpr (kVector == VectorUse::normalizer) {
    if (p.normalize)
      for (int i = threadIdx.x; i < DR; i += kChunkThreads) smem.vec[i] = key_sum_record(p, w, slot, at.hk)[i];
  } else if constexpr (kVector == VectorUse::rank_one) {
    if (p.normalize && threadIdx.x < kSlice)
      smem.vec[threadIdx.x] = key_sum_record(p, w, slot, at.hk)[at.slice * kSlice + threadIdx.x];
  }
  // (The loop's first barrier orders these stores before their readers.)

  // Per-head tiles: A of the query side, B and Vt (and the statistics) of the
  // key side; the others are the kv head's, loaded with head 0. Non-causal a
  // pass needs only A (out = A S'): the key side one item.
  const bool per_head_tiles = !kKeySide || p.causal;
  const bool kv_tiles = kKeySide || p.causal;
  const int heads = per_head_tiles ? p.group : 1;
  auto tiles_of = [&](int g) {
    PassTiles<T, DR>& own = smem.tiles[g % 2];
    PassTiles<T, DR>& shared = smem.tiles[0];
    return kKeySide ? ItemTiles<T>{shared.a, own.b, own.vt} : ItemTiles<T>{own.a, shared.b, shared.vt};
  };
  auto issue = [&](int g) {
    const ItemTiles<T> tiles = tiles_of(g);
    const int h = at.hk * p.group + g;
    const int col0 = at.slice * kSlice;
    if (g == 0 && kv_tiles) {
      if (kKeySide) {
        load_operand_async<DR>(tiles.a, p, kRoles.a, at.b, at.span, at.first, at.count, at.hk, 0);
      } else {
        load_operand_async<DR>(tiles.b, p, kRoles.b, at.b, at.span, at.first, at.count, at.hk, 0);
        load_operand_async<kSlice>(tiles.vt, p, kRoles.vt, at.b, at.span, at.first, at.count, at.hk, col0);
      }
    }
    if (per_head_tiles) {
      if (kKeySide) {
        load_operand_async<DR>(tiles.b, p, kRoles.b, at.b, at.span, at.first, at.count, h, 0);
        load_operand_async<kSlice>(tiles.vt, p, kRoles.vt, at.b, at.span, at.first, at.count, h, col0);
      } else {
        load_operand_async<DR>(tiles.a, p, kRoles.a, at.b, at.span, at.first, at.count, h, 0);
      }
      if (kWithStats)
        load_row_stats_async(smem.tiles[g % 2].raw_stats, p, w.row_stats, at.b, at.span, at.first, at.count, h);
    }
    sm80::cp_async_commit();
  };

  float out[8][4];  // key side: summed over the group's heads
  float row_sum[2];
  const bool tiles_transformed = transformed_in_tile(p, kRoles.a) || transformed_in_tile(p, kRoles.b) ||
                                 transformed_in_tile(p, kRoles.vt);
  const float a_multiplier = operand_multiplier(p, kRoles.a);
  const float score_multiplier = operand_multiplier(p, kRoles.b) * operand_multiplier(p, kRoles.vt);
  issue(0);  // with S' in the same group
  for (int g = 0; g < heads; ++g) {
    const ItemTiles<T> tiles = tiles_of(g);
    const int h = at.hk * p.group + g;
    sm80::cp_async_wait<0>();
    __syncthreads();  // the head's tiles landed; the previous head's readers are done with the other set
    if (g + 1 < heads) issue(g + 1);
    if (kWithStats && per_head_tiles) {
      convert_row_stats(smem.stats, p, smem.tiles[g % 2].raw_stats, at.count);
      __syncthreads();
    }
    if (g == 0 && kv_tiles) {
      if (kKeySide) {
        transform_operand<DR>(tiles.a, p, kRoles.a, at.count, smem.stats);
      } else {
        transform_operand<DR>(tiles.b, p, kRoles.b, at.count, smem.stats);
        transform_operand<kSlice>(tiles.vt, p, kRoles.vt, at.count, smem.stats);
      }
    }
    if (per_head_tiles) {
      if (kKeySide) {
        transform_operand<DR>(tiles.b, p, kRoles.b, at.count, smem.stats);
        transform_operand<kSlice>(tiles.vt, p, kRoles.vt, at.count, smem.stats);
      } else {
        transform_operand<DR>(tiles.a, p, kRoles.a, at.count, smem.stats);
      }
    }
    if (tiles_transformed) __syncthreads();
    if (!kKeySide || g == 0) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[nt][e] = 0.0f;
      row_sum[0] = row_sum[1] = 0.0f;
    }
    if (p.causal) accumulate_chunk_pairs<T, DR, kPass>(out, row_sum, tiles, smem.stats, score_multiplier);
    if (kKeySide && g + 1 < heads) continue;
    accumulate_state_product<DR, kOverValues>(out, tiles.a, smem.s);
    apply_a_multiplier(out, row_sum, a_multiplier);
    store_pass_rows<T, DR, kPass>(p, w, at, kKeySide ? at.hk : h, out, row_sum, tiles.a, a_multiplier, smem);
  }
}

}  // namespace cuflash::detail::linear
