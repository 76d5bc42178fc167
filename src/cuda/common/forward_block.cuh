// What the prefill forward kernels (sm80 mma.sync, sm90 wgmma) share beyond
// the GEMMs: the CTA's block of query rows and range of key tiles, the online
// softmax of one warp's m16 tile of scores, and the per-row results (lse, the
// split's partial output). Both kernels hold scores and O in the mma m16n8
// accumulator layout (g = lane / 4, t4 = lane % 4: rows g and g + 8, columns
// 2 t4 and 2 t4 + 1 of each n8 block), so one copy serves both.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/fast_divisor.hpp"
#include "common/online_softmax.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"

namespace cuflash::detail {

// The rows [m0, m0 + rows) of (batch b, head h) a CTA computes and its key
// tiles [t_lo, t_hi) of BN keys, for a grid of (query blocks, heads,
// batch x splits). active: some row of the block exists.
struct ForwardBlock {
  bool active = false;
  int b = 0, h = 0, hk = 0, split = 0, m0 = 0, rows = 0, t_lo = 0, t_hi = 0;
  SeqBounds seq;
  ScoreRules rules;
};

// The launch's divisors of a block's coordinates: z = b x splits + split,
// and a query head's kv head h / group. Built on the host from the params,
// so that a block's prologue runs no run-time integer division (each is a
// ~20-instruction dependent chain, and the TMA producer computes a block
// per work item on its way to the item's first load).
struct ForwardBlockDivisors {
  FastDivisor by_splits, by_group;

  static ForwardBlockDivisors of(const ForwardParams& p) {
    return {FastDivisor(static_cast<std::uint32_t>(p.num_splits)), FastDivisor(static_cast<std::uint32_t>(p.group))};
  }
};

// The block of grid position (x, y, z) of a (m_blocks, heads, batch x
// splits) grid; a persistent kernel walks these positions itself.
template <int BM, int BN>
__device__ __forceinline__ ForwardBlock forward_block_at(const ForwardParams& p, const ForwardBlockDivisors& d,
                                                         int m_blocks, int x, int y, int z) {
  ForwardBlock f;
  // Heaviest causal blocks (the last query rows) are scheduled first.
  const int m_block = m_blocks - 1 - x;
  f.h = y;
  f.b = d.by_splits.div(z);
  f.split = z - f.b * d.by_splits.value();
  f.seq = seq_bounds(p, f.b);
  f.m0 = m_block * BM;
  // No early return: one straight path keeps the caller's register
  // allocation what it was with this code inline (an early return here cost
  // the sm80 D=128 kernel 70 more bytes of spills).
  f.active = f.m0 < f.seq.q_len;
  f.hk = d.by_group.div(f.h);
  f.rules = score_rules(p, f.seq, f.b, f.h);
  f.rows = min(BM, f.seq.q_len - f.m0);
  int key_lo, key_hi;
  f.rules.key_range(f.m0, f.rows, &key_lo, &key_hi);
  f.t_lo = key_lo / BN;
  f.t_hi = (key_hi + BN - 1) / BN;
  if (p.num_splits > 1) {
    const int per = (f.t_hi - f.t_lo + p.num_splits - 1) / p.num_splits;
    const int first = f.t_lo + f.split * per;
    f.t_hi = min(f.t_hi, first + per);
    f.t_lo = first;
  }
  return f;
}

template <int BM, int BN>
__device__ __forceinline__ ForwardBlock forward_block(const ForwardParams& p, const ForwardBlockDivisors& d) {
  return forward_block_at<BM, BN>(p, d, gridDim.x, blockIdx.x, blockIdx.y, blockIdx.z);
}

// Row `half` (0: g, 1: g + 8) of a warp's m16 x (8 NT) tile of scores s,
// whose key 0 is n0, as (masked, transformed) base-2 logits of row i.
// (One row per call: a form taking several rows with per-row arrays of the
// bounds changed the row-by-row kernels' code, the sm80 dropout forward's
// spills 0 -> 92 bytes.)
template <int NT, bool Transformed>
__device__ __forceinline__ void logits_row_m16(float (&s)[NT][4], int half, const ScoreRules& rules, int i, int n0,
                                               bool masked, int t4) {
  if (Transformed || masked) {
    // Visible keys of row i are [lo, hi): two compares per score.
    int lo = 0, hi = rules.k_len;
    if (masked) rules.row_keys(i, &lo, &hi);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = n0 + nt * 8 + 2 * t4 + e;
        float& x = s[nt][half * 2 + e];
        if constexpr (Transformed) x = rules.logit2(x, i, j);
        if (j < lo || j >= hi) x = -INFINITY;
      }
  }
}

// One online-softmax step over a warp's m16 x (8 NT) tile of scores s whose
// key 0 is n0 and whose row g (half 0) is i0: the scores become (masked,
// transformed) base-2 logits, then P = exp2(logit - max) in place; the rows'
// max and sum are updated and correction[half] is the factor that O
// accumulated so far must be scaled by. mult: score -> base-2 logit
// (1 when Transformed: logit2 already applied it). Max: how the running max
// follows (online_softmax.cuh). Row by row: row g's step, then row g + 8's.
template <int NT, bool Transformed, RunningMax Max>
__device__ __forceinline__ void online_softmax_m16(float (&s)[NT][4], float (&row_max)[2], float (&row_sum)[2],
                                                   float (&correction)[2], const ScoreRules& rules, int i0, int n0,
                                                   bool masked, int t4, float mult) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    logits_row_m16<NT, Transformed>(s, half, rules, i0 + half * 8, n0, masked, t4);
    correction[half] = online_softmax_row_step<NT, Max>(
        [&](int nt, int e) -> float& { return s[nt][half * 2 + e]; }, row_max[half], row_sum[half], mult);
  }
}

// The same step with both rows' chains interleaved (online_softmax_rows_step;
// bitwise the same results): for a kernel bound by the exponentials' issue,
// where one row's max and shuffles would otherwise sit between the two
// rows' exponentials. midway: online_softmax_rows_step's hook.
template <int NT, bool Transformed, RunningMax Max, class Midway>
__device__ __forceinline__ void online_softmax_m16_rows_together(float (&s)[NT][4], float (&row_max)[2],
                                                                 float (&row_sum)[2], float (&correction)[2],
                                                                 const ScoreRules& rules, int i0, int n0,
                                                                 bool masked, int t4, float mult, Midway&& midway) {
  // Both rows behind one branch: with a branch each, ptxas laid the step
  // out as two blocks, and the D = 64 kernel's loop took ~35 more
  // instructions.
  if (Transformed || masked) {
    logits_row_m16<NT, Transformed>(s, 0, rules, i0, n0, masked, t4);
    logits_row_m16<NT, Transformed>(s, 1, rules, i0 + 8, n0, masked, t4);
  }
  online_softmax_rows_step<NT, 2, Max>([&](int half, int nt, int e) -> float& { return s[nt][half * 2 + e]; },
                                       row_max, row_sum, correction, mult, midway);
}

// A warp's m16 tile of P (the scores after online_softmax_m16), rounded
// to T, as the m16k16 A fragments of P V: the accumulator layout of two n8
// blocks is the A fragment of one k16 step.
template <typename T, int KP>
__device__ __forceinline__ void p_fragments_m16(const float (&s)[2 * KP][4], std::uint32_t (&pa)[KP][4]) {
#pragma unroll
  for (int kk = 0; kk < KP; ++kk) {
    pa[kk][0] = sm80::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = sm80::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = sm80::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = sm80::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// O of a warp's m16 rows scaled by their online-softmax corrections
// (correction[0]: row g, correction[1]: row g + 8).
template <int DT>
__device__ __forceinline__ void rescale_rows_m16(float (&o)[DT][4], const float (&correction)[2]) {
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= correction[0];
    o[dt][1] *= correction[0];
    o[dt][2] *= correction[1];
    o[dt][3] *= correction[1];
  }
}

// The same, skipped by a warp whose rows all kept their max (corrections
// exactly 1: online_softmax_row_step's lag), as most tiles do; the vote
// makes the branch warp-uniform, so the whole warp calls it. (The sm80
// kernel multiplies always: the branch moved its register allocation,
// which was tuned by measurement, from 40 to 52 bytes of spill stores at
// D = 128.)
template <int DT>
__device__ __forceinline__ void rescale_moved_rows_m16(float (&o)[DT][4], const float (&correction)[2]) {
  if (__any_sync(0xffffffffu, correction[0] != 1.0f || correction[1] != 1.0f)) rescale_rows_m16<DT>(o, correction);
}

// Offset of this (split, batch, head)'s row 0 in the split-KV partials.
__device__ __forceinline__ std::int64_t partial_row0(const ForwardParams& p, const ForwardBlock& f) {
  return ((static_cast<std::int64_t>(f.split) * p.batch + f.b) * p.heads_q + f.h) *
         static_cast<std::int64_t>(p.max_q_len);
}

// The end of a warp's m16 tile of rows (row g of half 0 is i0), in two
// parts: the rows' 1 / sum (inv_sum) and lse (natural log), then the lse
// written to p.lse, or to the split's partial lse.
// A row's total is 0 (no visible key) or at least 1 (the exponential of
// the running max's own score), never denormal: the hardware reciprocal and
// log2 take it without the precise forms' slow-path branches, which
// serialized the two halves' chains at an item's end (NOTES.md, session 34).
__device__ __forceinline__ void row_totals_m16(const float (&row_max)[2], const float (&row_sum)[2], float mult,
                                               float (&inv_sum)[2], float (&lse)[2]) {
  const float l[2] = {online_softmax_row_total(row_sum[0]), online_softmax_row_total(row_sum[1])};
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    inv_sum[half] = l[half] > 0.0f ? sm80::fast_rcp(l[half]) : 0.0f;
    lse[half] = l[half] > 0.0f ? (row_max[half] * mult + sm80::fast_log2(l[half])) * kLn2 : -INFINITY;
  }
}
__device__ __forceinline__ void write_lse_m16(const ForwardParams& p, const ForwardBlock& f, const float (&lse)[2],
                                              int i0, int t4) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + half * 8;
    if (i < f.seq.q_len && t4 == 0) {
      if (p.num_splits > 1) {
        p.lse_partial[partial_row0(p, f) + i] = lse[half];
      } else if (p.lse != nullptr) {
        p.lse[lse_offset(p, f.b, f.seq.q_start, i, f.h)] = lse[half];
      }
    }
  }
}
__device__ __forceinline__ void finish_rows_m16(const ForwardParams& p, const ForwardBlock& f,
                                                const float (&row_max)[2], const float (&row_sum)[2], float mult,
                                                int i0, int t4, float (&inv_sum)[2]) {
  float lse[2];
  row_totals_m16(row_max, row_sum, mult, inv_sum, lse);
  write_lse_m16(p, f, lse, i0, t4);
}

// A warp's m16 x D tile of O, normalized, as this split's fp32 partial: rows
// of the caller's head_dim (a multiple of 8; D is the kernel's, at least that).
template <int D>
__device__ __forceinline__ void write_partial_m16(const ForwardParams& p, const ForwardBlock& f,
                                                  const float (&o)[D / 8][4], const float (&inv_sum)[2], int i0,
                                                  int t4) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + half * 8;
    if (i >= f.seq.q_len) continue;
    float* row = p.out_partial + (partial_row0(p, f) + i) * p.head_dim;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      if (dt * 8 < p.head_dim)
        *reinterpret_cast<float2*>(row + dt * 8 + 2 * t4) =
          make_float2(o[dt][half * 2] * inv_sum[half], o[dt][half * 2 + 1] * inv_sum[half]);
  }
}

// A warp's m16 x D tile of O, normalized, into out straight from the
// accumulators (a 4-byte pair per thread and n8 block, each store 8 rows:
// far slower than staged rows, NOTES.md session 32): for the rare O that
// has no K/V stage to be staged in (the TMA forward's items without key
// tiles when it has one Q buffer). Rows past the sequence and columns past
// the caller's head_dim (a multiple of 8) are not written.
template <typename T, int D>
__device__ __forceinline__ void write_out_m16(const ForwardParams& p, const ForwardBlock& f,
                                              const float (&o)[D / 8][4], const float (&inv_sum)[2], int i0, int t4) {
  T* const out = static_cast<T*>(p.out) + row_offset(p.out_strides, f.b, f.seq.q_start, 0, f.h);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = i0 + half * 8;
    if (i >= f.seq.q_len) continue;
    T* row = out + static_cast<std::int64_t>(i) * p.out_strides.row;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      if (dt * 8 < p.head_dim)
        *reinterpret_cast<std::uint32_t*>(row + dt * 8 + 2 * t4) =
            sm80::pack2<T>(o[dt][half * 2] * inv_sum[half], o[dt][half * 2 + 1] * inv_sum[half]);
  }
}

}  // namespace cuflash::detail
