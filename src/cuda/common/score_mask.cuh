// Device-side attention semantics shared by the forward and backward kernels:
// where a sequence's rows are (SeqBounds: dense or varlen, a KV cache's
// first key), where its rows' out and lse live, and the score rules of a
// (sequence, head) built from the call's parameters (the rules themselves,
// shared with the CPU reference: src/core/score_rules.hpp).
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/rows_seeing.hpp"
#include "score_rules.hpp"

namespace cuflash::detail {

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

// The visibility of sequence `s` under the call's windows (rows_seeing.hpp).
__device__ __forceinline__ KeyVisibility key_visibility(const AttentionParams& p, const SeqBounds& s) {
  KeyVisibility v;
  v.offset = diagonal(p, s);
  v.q_len = s.q_len;
  v.window_left = p.window_left;
  v.window_right = p.window_right;
  return v;
}

// Sequence-relative row range [lo, hi) of the queries that see some key of
// [n0, n1) (n1 <= k_len).
__device__ __forceinline__ void query_rows_seeing(const AttentionParams& p, const SeqBounds& seq, int n0, int n1,
                                                  std::int64_t* lo, std::int64_t* hi) {
  query_rows_seeing(key_visibility(p, seq), n0, n1, lo, hi);
}

// A row's natural-log lse in base 2; a row with no visible key (lse -inf)
// gets +inf, so that every P of it is exp2(-inf) = 0.
__device__ __forceinline__ float lse_base2(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

// The score rules (score_rules.hpp) of sequence b's query head h.
__device__ __forceinline__ ScoreRules score_rules(const AttentionParams& p, const SeqBounds& s, int b, int h) {
  ScoreRules r;
  r.set_sequence(s.q_len, s.k_len, s.k_first, diagonal(p, s), p.window_left, p.window_right);
  r.set_scales(p.softmax_scale, p.softmax_scale_log2, p.softcap);
  if (p.alibi_slopes != nullptr)
    r.alibi_log2 = p.alibi_slopes[b * p.alibi_batch_stride + h * p.alibi_head_stride] * kLog2e;
  r.set_transformed(p.alibi_slopes != nullptr);
  return r;
}

}  // namespace cuflash::detail
