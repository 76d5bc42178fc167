// AttentionParams: what every attention kernel of backend=cuda reads, flattened
// from a validated Problem into plain pointers, strides and flags so that the
// same struct reaches device code by value. No CUDA types: it is included by
// the host-side backend and by the kernels alike.
#pragma once

#include <cstdint>

#include "philox.hpp"

namespace cuflash {
struct TensorView;
}

namespace cuflash::detail {

struct Problem;
enum class Layout;

// Strides, in elements, of one [batch?, row, head, dim] tensor. For varlen the
// batch stride is 0 and rows are offset by cu_seqlens instead.
struct RowStrides {
  std::int64_t batch = 0, row = 0, head = 0;
};

// Page sizes backend cuda takes (KV caches and paged prefill): powers of two,
// whose page and slot are a shift and a mask, and multiples of
// kPageSizeMultiple (flash-attn's page sizes are multiples of 256), whose
// page and slot are a division: a decode key tile (64 keys, 16 in the wide
// CTA) then never straddles two pages.
inline constexpr int kPageSizeMultiple = 64;
constexpr bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }
constexpr bool cuda_page_size_supported(int page_size) {
  return is_power_of_two(page_size) || (page_size > 0 && page_size % kPageSizeMultiple == 0);
}
inline constexpr const char* kCudaPageSizeRule = "a power of two or a multiple of 64";

// A KV cache (Layout::kv_cache) as the decode and append kernels see it; k/v
// (and their strides) are the cache itself. Key j of sequence b lives in
//   paged:      page = block_table[b * block_table_stride + j / page_size],
//               slot = j % page_size (a shift and a mask when page_shift >= 0)
//   contiguous: page = b, slot = j
// at k + page * k_strides.batch + slot * k_strides.row + hk * k_strides.head.
// Lengths (seqlens_k, leftpad) are read on the device, so that a call with
// check_index_contents off needs no host copy of them.
// The rotary embedding of q and k_new in a KV-cache forward (src/core/rotary.hpp
// has the rule): cos/sin [seqlen_ro, dim / 2] in the kernels' element type.
struct RotaryParams {
  const void* cos = nullptr;  // nullptr: no rotary embedding
  const void* sin = nullptr;
  std::int64_t cos_row_stride = 0, sin_row_stride = 0;  // elements
  int dim = 0;                // rotated columns (even, <= head_dim)
  bool interleaved = false;   // GPT-J pairs (2k, 2k + 1); else GPT-NeoX (k, k + dim / 2)
  bool positional = false;    // query row i at seqlens_k[b] + i (causal or windowed), else at seqlens_k[b]
};

struct KvCacheParams {
  const std::int32_t* seqlens_k = nullptr;    // [B] keys cached before the append
  const std::int32_t* leftpad = nullptr;      // [B] cache row of each sequence's first key; nullptr: 0
  const std::int32_t* block_table = nullptr;  // paged: [B, max_pages]; nullptr: contiguous
  std::int64_t block_table_stride = 0;        // elements between two sequences' rows
  int page_size = 0;                          // paged: keys per page (cuda_page_size_supported)
  int page_shift = -1;                        // paged: log2(page_size), or -1 if no power of two
  int num_pages = 0;                          // paged: pages in k/v (bound of an entry)
  int capacity = 0;                           // keys one sequence can hold
  int new_len = 0;                            // rows of k_new/v_new per sequence (0: none)
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  RowStrides k_new_strides, v_new_strides;    // [B, new_len, Hk, D]
  RotaryParams rotary;
};

struct AttentionParams {
  // Forward inputs (and backward's recomputation inputs). Element type is the
  // kernel's template type; the last dimension is contiguous.
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  RowStrides q_strides, k_strides, v_strides;

  // Varlen: int32 [batch+1] on the device; nullptr for dense.
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;

  int batch = 0, heads_q = 0, heads_kv = 0, group = 1, head_dim = 0;
  int max_q_len = 0, max_kv_len = 0;  // dense: the lengths themselves

  // Scores. softmax_scale_log2 = softmax_scale * log2(e).
  float softmax_scale = 1.0f;
  float softmax_scale_log2 = 1.0f;
  float softcap = 0.0f;  // 0: off
  int window_left = -1, window_right = -1;  // -1: unbounded (causal => right 0)
  // Key j is aligned with query i when j = i + diagonal_offset; without it,
  // k_len - q_len of each sequence (bottom-right). score_mask.cuh: diagonal().
  bool has_diagonal_offset = false;
  int diagonal_offset = 0;
  const float* alibi_slopes = nullptr;       // [Hq] or [B, Hq]
  std::int64_t alibi_batch_stride = 0;       // 0 for [Hq]
  std::int64_t alibi_head_stride = 1;

  // Dropout (philox.hpp's mask); dropout.threshold16 == 0: nothing dropped (has_dropout: p > 0). Kept entries
  // of the normalized probabilities are scaled by dropout_keep_scale = 1/(1-p).
  bool has_dropout = false;
  DropoutRng dropout;
  float dropout_keep_scale = 1.0f;

  // lse: float32 [B, Hq, S] (varlen [Hq, total]); strides in elements.
  float* lse = nullptr;  // forward: optional output; backward: input
  std::int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 1;

  // Row range of sequence b: dense [0, max_q_len); varlen [cu[b], cu[b+1]).
  // (Device code uses the equivalent helpers in score_mask.cuh.)

  // KV cache only (layout kv_cache); seqlens_k == nullptr otherwise.
  KvCacheParams cache;
};

// Whether the kernels take each score through ScoreRules::logit2 (their
// `Transformed` variants) instead of scaling it at the exponent: softcap and
// ALiBi change the logit, and a softmax_scale that is not positive breaks
// the plain variants' shortcut, the forward's row max taken over unscaled
// scores (with a negative scale that max is the logits' minimum and exp2
// overflows; with 0 the first tile's correction is exp2(-inf x 0), NaN).
// The one rule every launch picks its variant by.
inline bool transformed_scores(const AttentionParams& p) {
  return p.softcap > 0.0f || p.alibi_slopes != nullptr || !(p.softmax_scale > 0.0f);
}

struct ForwardParams : AttentionParams {
  void* out = nullptr;  // like q
  RowStrides out_strides;

  // Split-KV: num_splits > 1 writes each split's normalized partial output
  // and lse (float32, [split, batch*?]) to these workspace buffers, which a
  // combine kernel merges into out/lse. Laid out as
  // out_partial[split][b][h][row][d] and lse_partial[split][b][h][row] with
  // row < max_q_len (dense and KV cache; varlen rows by cu_seqlens_q).
  int num_splits = 1;
  float* out_partial = nullptr;
  float* lse_partial = nullptr;
};

struct BackwardParams : AttentionParams {
  const void* out = nullptr;  // forward output, like q
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  RowStrides out_strides, dout_strides, dq_strides, dk_strides, dv_strides;
  bool deterministic = false;

  // Workspace (float32, contiguous), sized by flash_bwd_workspace_bytes():
  //   dq_accum [Hq, q rows, D]: q rows = batch*max_q_len (dense) or total_q (varlen);
  //            head-major so that a tile's rows are D floats apart, a constant
  //            the dQ atomics fold into their immediate offsets
  //   dsum     [Hq, q rows]:    D_i = dot(dout_i, out_i)
  float* dq_accum = nullptr;
  float* dsum = nullptr;
  std::int64_t total_q_rows = 0;
};

// Element strides of a dense [B, S, H, D] or varlen [total, H, D] view (batch 0).
RowStrides row_strides(const TensorView& view, Layout layout);

// The cache of a KV-cache Problem, or the pages of a paged varlen one
// (Problem::paged_varlen(): no seqlens_k, no append).
KvCacheParams make_kv_cache_params(const Problem& problem);
// Fills the common part from a validated forward or backward Problem.
AttentionParams make_attention_params(const Problem& problem);
// The common part plus the output (split-KV and workspace fields left as is).
ForwardParams make_forward_params(const Problem& problem);
// The common part plus out, dout, dq, dk, dv, `deterministic` and
// total_q_rows (workspace pointers left null).
BackwardParams make_backward_params(const Problem& problem);
// Rows of q seen as [rows, Hq, D]: batch * max_q_len (dense) or total_q (varlen).
std::int64_t total_q_rows(const Problem& problem);

}  // namespace cuflash::detail
