// Device-side attention semantics shared by the forward and backward kernels:
// where a sequence's rows are, which keys a query row sees, and how a raw
// dot product becomes a base-2 logit (scale, softcap, ALiBi). Positions i, j
// are relative to the sequence; key j is aligned with query i when
// j = i + offset, offset = diagonal(): k_len - q_len (bottom-right, as
// flash-attn) or the call's diagonal_offset (docs/semantics.md).
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"

namespace cuflash::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct SeqBounds {
  int q_start = 0, q_len = 0;  // packed row of query 0 (varlen), rows
  int k_start = 0, k_len = 0;
  // The first key of the sequence: keys are [k_first, k_len). A KV cache's
  // leftpad (cache_first_key); 0 everywhere else, so the other kernels' masks
  // fold it away.
  int k_first = 0;
};

__device__ __forceinline__ SeqBounds seq_bounds(const AttentionParams& p, int b) {
  SeqBounds s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_start = p.cu_seqlens_q[b];
    s.q_len = p.cu_seqlens_q[b + 1] - s.q_start;
    s.k_start = p.cu_seqlens_k[b];
    s.k_len = p.cu_seqlens_k[b + 1] - s.k_start;
  } else {
    s.q_len = p.max_q_len;
    s.k_len = p.max_kv_len;
  }
  return s;
}

// Key j is aligned with query i of this sequence when j = i + diagonal().
__device__ __forceinline__ int diagonal(const AttentionParams& p, const SeqBounds& s) {
  return p.has_diagonal_offset ? p.diagonal_offset : s.k_len - s.q_len;
}

// Element offset of row `row` (relative to the sequence) of head `h` in batch b.
__device__ __forceinline__ std::int64_t row_offset(const RowStrides& st, int b, int seq_start, int row, int h) {
  return static_cast<std::int64_t>(b) * st.batch + static_cast<std::int64_t>(seq_start + row) * st.row +
         static_cast<std::int64_t>(h) * st.head;
}

// Offset of lse[b, h, i] (dense) or lse[h, q_start + i] (varlen, batch stride 0).
__device__ __forceinline__ std::int64_t lse_offset(const AttentionParams& p, int b, int seq_start, int row, int h) {
  return static_cast<std::int64_t>(b) * p.lse_batch_stride + static_cast<std::int64_t>(h) * p.lse_head_stride +
         static_cast<std::int64_t>(seq_start + row) * p.lse_row_stride;
}

// Score rules of one (batch, head).
struct ScoreRules {
  int offset = 0, k_first = 0, k_len = 0, window_left = -1, window_right = -1;
  float scale_log2 = 1.0f;       // raw dot -> base-2 logit when no softcap/ALiBi
  float scale_over_cap = 0.0f;   // softcap: tanh argument per unit of dot
  float cap_log2 = 0.0f;         // softcap: softcap * log2(e); 0 when off
  float alibi_log2 = 0.0f;       // slope * log2(e); 0 when off
  bool transformed = false;      // softcap or ALiBi: logit2() must be applied per element

  // (k_first's tests are written so that they vanish where k_first is the
  // constant 0 of seq_bounds(): the kernels without a KV cache compile as
  // they did without it.)
  __device__ __forceinline__ bool visible(int i, int j) const {
    return j < k_len && (k_first == 0 || j >= k_first) && (window_right < 0 || j <= i + offset + window_right) &&
           (window_left < 0 || j >= i + offset - window_left);
  }
  // Keys [lo, hi) row i sees (lo >= hi: none).
  __device__ __forceinline__ void row_keys(int i, int* lo, int* hi) const {
    *lo = window_left >= 0 ? max(k_first, i + offset - window_left) : k_first;
    *hi = window_right >= 0 ? min(k_len, i + offset + window_right + 1) : k_len;
  }
  // Base-2 logit of a raw dot product (only needed when `transformed`).
  __device__ __forceinline__ float logit2(float dot, int i, int j) const { return logit2(dot, i, j, alibi_log2); }
  // The same with the ALiBi slope (times log2(e)) of another head of the
  // batch: the decode kernel holds several query heads in one CTA.
  __device__ __forceinline__ float logit2(float dot, int i, int j, float slope_log2) const {
    float squashed;
    return logit2(dot, i, j, slope_log2, &squashed);
  }
  // The same for the backward, which also needs softcap's derivative: the
  // logit is cap * tanh(dot * scale / cap) (+ ALiBi), so d logit / d(scaled
  // dot) = 1 - tanh^2; *squashed receives that tanh (0 without softcap).
  __device__ __forceinline__ float logit2(float dot, int i, int j, float slope_log2, float* squashed) const {
    float s;
    if (cap_log2 != 0.0f) {
      *squashed = tanhf(dot * scale_over_cap);
      s = cap_log2 * *squashed;
    } else {
      *squashed = 0.0f;
      s = dot * scale_log2;
    }
    if (slope_log2 != 0.0f) s -= slope_log2 * fabsf(static_cast<float>(i + offset - j));
    return s;
  }
  // Softcap's factor on dS, from logit2's *squashed: 1 - tanh^2.
  __device__ __forceinline__ static float softcap_grad(float squashed) { return 1.0f - squashed * squashed; }
  // Keys [lo, hi) that some row of [row0, row0 + rows) may see.
  __device__ __forceinline__ void key_range(int row0, int rows, int* lo, int* hi) const {
    int l = k_first, h = k_len;
    if (window_left >= 0) l = max(l, row0 + offset - window_left);
    if (window_right >= 0) h = min(h, row0 + rows - 1 + offset + window_right + 1);
    *lo = l;
    *hi = max(h, l);
  }
  // Whether every row of [row0, row0+rows) sees every key of [key0, key0+keys)
  // (so the tile needs no per-element mask).
  __device__ __forceinline__ bool tile_unmasked(int row0, int rows, int key0, int keys) const {
    if (key0 + keys > k_len || (k_first > 0 && key0 < k_first)) return false;
    if (window_right >= 0 && key0 + keys - 1 > row0 + offset + window_right) return false;
    if (window_left >= 0 && key0 < row0 + rows - 1 + offset - window_left) return false;
    return true;
  }
};

__device__ __forceinline__ ScoreRules score_rules(const AttentionParams& p, const SeqBounds& s, int b, int h) {
  ScoreRules r;
  r.offset = diagonal(p, s);
  r.k_first = s.k_first;
  r.k_len = s.k_len;
  // A window side that masks no key of the sequence is unbounded; clamping
  // them keeps i + offset +- window inside int32 whatever the caller passed.
  // (No overflow here: without diagonal_offset these are k_len - 1 and
  // q_len - 1; with it validate() holds |offset| and the lengths to 2^30.)
  r.window_left = p.window_left >= s.q_len - 1 + r.offset ? -1 : p.window_left;
  r.window_right = p.window_right >= s.k_len - 1 - r.offset ? -1 : p.window_right;
  r.scale_log2 = p.softmax_scale_log2;
  if (p.softcap > 0.0f) {
    r.scale_over_cap = p.softmax_scale / p.softcap;
    r.cap_log2 = p.softcap * kLog2e;
  }
  if (p.alibi_slopes != nullptr) {
    r.alibi_log2 = p.alibi_slopes[b * p.alibi_batch_stride + h * p.alibi_head_stride] * kLog2e;
  }
  r.transformed = r.cap_log2 != 0.0f || p.alibi_slopes != nullptr;
  return r;
}

}  // namespace cuflash::detail
