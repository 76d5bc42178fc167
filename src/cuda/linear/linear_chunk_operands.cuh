// The operands of the chunked linear-attention kernels: which tensor fills
// each tile of a pass, how it is transformed in shared memory, and the
// per-row statistics of the normalized backward.
//
// Every pass (linear_chunk_pass.cuh) computes, per 64-row chunk and per
// 64-column slice of Vt, with S' [DR x 64] the chunk's state (16 bits, from
// the walk of linear_chunk_state.cuh, which sums S += Bᵀ Vt chunk by chunk):
//   out = A S' + mask(A Bᵀ) Vt
// and the roles below make that one form the forward and the three gradients
// (docs/linear.md, "Backward"; den_t the normalizer, δ_t = dout_t · o_t, so
// that dnum_t = dout_t / den_t and dden_t = -δ_t / den_t):
//   pass    A      B         Vt              S'          mask     scores
//   output  φQ_h   φK        V[:, j]         S[:, j]     s <= t
//   dq      dO_h   V         φK[:, i]        S[i, :]ᵀ    s <= t   - δ_t (row)
//   dv      φK     φQ_h/den  dO_h[:, j]      G[:, j]     t >= s
//   dk      V      dO_h      φQ_h[:, i]/den  G[i, :]ᵀ    t >= s   - δ_t (column)
// (S the state before the chunk, G = dS the gradient of the state after it;
// dq's out is den_t · dφq_t less its -δ_t z term, which its epilogue adds.)
// dout is never divided by den in 16 bits: the query rows that meet it
// carry 1/den_t instead (or the fp32 epilogue does), so that a row whose
// normalizer is eps (relu of a query with no positive entry: φq = 0, den =
// 1e-10) keeps its zero weights instead of overflowing f16 into 0 x inf.
#pragma once

#include "linear/linear_chunk_tiles.cuh"

namespace cuflash::detail::linear {

enum class Operand {
  query,           // scale·φ(q), a query head's rows
  query_over_den,  // scale·φ(q_t) / den_t (normalize; else as query): the rows that meet dout
  key,             // φ(k), the kv head's rows
  value,           // v, the kv head's rows
  dout,            // dout, a query head's rows, as given
};

enum class Pass { output, row_stats, dq, dv, dk };

struct PassRoles {
  Operand a, b, vt;
  // false, the query side: A per query head, B and Vt the kv head's; chunks
  //   in order, mask s <= t (keys up to the row); an output row per query head.
  // true, the key side: A the kv head's, B and Vt per query head; chunks in
  //   reverse, mask t >= s (queries from the row on); an output row per kv
  //   head, summed over its group.
  bool key_side;
};

// row_stats is the output pass with another epilogue (dout · num and den).
constexpr PassRoles pass_roles(Pass pass) {
  switch (pass) {
    case Pass::dq: return {Operand::dout, Operand::value, Operand::key, false};
    case Pass::dv: return {Operand::key, Operand::query_over_den, Operand::dout, true};
    case Pass::dk: return {Operand::value, Operand::dout, Operand::query_over_den, true};
    default: return {Operand::query, Operand::key, Operand::value, false};
  }
}

constexpr bool of_query_head(Operand op) { return op == Operand::query || op == Operand::query_over_den || op == Operand::dout; }
constexpr bool of_key_dim(Operand op) { return op != Operand::value && op != Operand::dout; }

CUFLASH_HOST_DEVICE int operand_width(const LinearParams& p, Operand op) {
  return of_key_dim(op) ? p.key_dim : p.value_dim;
}

__device__ __forceinline__ const RowsView& operand_view(const LinearParams& p, Operand op) {
  switch (op) {
    case Operand::key: return p.k;
    case Operand::value: return p.v;
    case Operand::dout: return p.dout;
    default: return p.q;
  }
}

__device__ __forceinline__ std::int64_t row_stats_index(const LinearParams& p, int b, const SequenceSpan& span, int t,
                                                        int h) {
  return packed_row(p, b, span, t) * p.heads_q + h;
}

// Per row of a chunk and one query head: 1/den_t and -δ_t = -(dout_t · num_t) / den_t,
// (1, 0) without normalize and 0 for rows past the sequence.
struct ChunkRowStats {
  float inv_den[kChunk];
  float minus_delta[kChunk];
};

// The RowStats of the chunk's rows [0, count) for query head h (normalize;
// nothing without): cp.async, not committed.
__device__ __forceinline__ void load_row_stats_async(RowStats* raw, const LinearParams& p, const RowStats* stats,
                                                     int b, const SequenceSpan& span, int first, int count, int h) {
  if (!p.normalize) return;
  static_assert(sizeof(RowStats) == 16, "one cp.async per row");
  for (int r = threadIdx.x; r < count; r += kChunkThreads)
    sm80::cp_async_16(raw + r, stats + row_stats_index(p, b, span, first + r, h));
}

// raw (landed, after a barrier) -> out. No barrier.
__device__ __forceinline__ void convert_row_stats(ChunkRowStats& out, const LinearParams& p, const RowStats* raw,
                                                  int count) {
  for (int r = threadIdx.x; r < kChunk; r += kChunkThreads) {
    float inv_den = r < count ? 1.0f : 0.0f, minus_delta = 0.0f;
    if (p.normalize && r < count) {
      const float dot = raw[r].dot[0] + (p.value_dim > kSlice ? raw[r].dot[1] : 0.0f);
      inv_den = 1.0f / raw[r].den;
      minus_delta = -dot * inv_den;
    }
    out.inv_den[r] = inv_den;
    out.minus_delta[r] = minus_delta;
  }
}

// Rows [first, first + count) of `op` for head `head` (a query head or the kv
// head, as the operand is), columns [col0, col0 + W), into a [64][W] tile;
// cp.async, not committed; rows >= count zero-filled.
template <int W, typename T>
__device__ __forceinline__ void load_operand_async(T* tile, const LinearParams& p, Operand op, int b,
                                                   const SequenceSpan& span, int first, int count, int head,
                                                   int col0) {
  const RowsView& view = operand_view(p, op);
  load_tile_async<W>(tile, row_pointer<const T>(view, b, span, first, head) + col0, view.row_stride, count);
}

// Whether a tile of `op` needs its transform in shared memory: a feature map
// other than identity, or 1/den (normalize). Otherwise the loaded rows are
// the operand up to operand_multiplier's constant (rows past the sequence
// are zero-filled by the load), and the kernels apply that constant to their
// fp32 products instead: a pass of tiles and a barrier saved per operand.
CUFLASH_HOST_DEVICE bool transformed_in_tile(const LinearParams& p, Operand op) {
  switch (op) {
    case Operand::query:
    case Operand::key: return p.map != Map::identity;
    case Operand::query_over_den: return p.map != Map::identity || p.normalize;
    default: return false;  // v and dout as loaded
  }
}

// The constant a products' user multiplies by for an untransformed tile (the scale of φ(q)).
CUFLASH_HOST_DEVICE float operand_multiplier(const LinearParams& p, Operand op) {
  const bool of_queries = op == Operand::query || op == Operand::query_over_den;
  return of_queries && !transformed_in_tile(p, op) ? p.scale : 1.0f;
}

// The operand's transform in place where transformed_in_tile says so (after
// its cp.async landed and a barrier; `stats` loaded for query_over_den).
// Padding rows stay 0 (φ(0) is 1 for elu+1: they must not join the sums). No barrier.
template <int W, int kThreads = kChunkThreads, typename T>
__device__ __forceinline__ void transform_operand(T* tile, const LinearParams& p, Operand op, int count,
                                                  const ChunkRowStats& stats) {
  if (!transformed_in_tile(p, op)) return;
  if (op == Operand::key) {
    transform_tile<W, kThreads>(tile, [&](int row, float x) { return row < count ? feature(p.map, x) : 0.0f; });
    return;
  }
  const bool over_den = op == Operand::query_over_den;
  transform_tile<W, kThreads>(tile, [&](int row, float x) {
    const float multiplier = over_den ? p.scale * stats.inv_den[row] : p.scale;
    return row < count ? multiplier * feature(p.map, x) : 0.0f;
  });
}

}  // namespace cuflash::detail::linear
