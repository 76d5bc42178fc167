// Problem: one validated attention call, normalized so that backends see a
// single shape of input whether it came dense, varlen or as a KV cache.
// Built only by validate_*(); every field here has been checked.
#pragma once

#include <cstdint>
#include <vector>

#include "cuflash/attention.hpp"
#include "cuflash/tensor.hpp"
#include "philox.hpp"

namespace cuflash::detail {

enum class Pass { forward, backward };
enum class Layout { dense, varlen, kv_cache };

const char* layout_name(Layout layout);

struct Problem {
  Pass pass = Pass::forward;
  Layout layout = Layout::dense;
  DType dtype = DType::f32;  // of q, k, v, out (and dout, dq, dk, dv)
  Device device{};

  int batch = 0;
  int heads_q = 0;
  int heads_kv = 0;
  int head_dim = 0;
  int max_q_len = 0;   // over the batch
  int max_kv_len = 0;  // over the batch; for a KV cache: cached + new keys

  // KV cache; and the page fields for a varlen call whose keys are in a
  // paged cache (paged_varlen(): flash-attn's paged prefill), where key j of
  // sequence b, j < kv_len(b) counted by cu_seqlens_k, is cache position j.
  bool paged = false;
  int page_size = 0;       // paged: keys per page; contiguous cache: its capacity
  int num_pages = 0;       // paged: pages in the cache; contiguous: cache batch size
  int max_pages = 0;       // paged: block_table columns
  int cache_capacity = 0;  // keys one sequence can hold
  int new_len = 0;         // rows of k_new/v_new per sequence (0: no append)
  bool has_leftpad = false;  // kv_cache.leftpad given: sequence b's keys start at cache row leftpad[b]
  // Rotary embedding of q and k_new (rotary.hpp): rotary_dim columns, 0 = none.
  int rotary_dim = 0;
  bool rotary_interleaved = false;

  // Resolved options.
  float softmax_scale = 0.0f;
  bool causal = false;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded; 0 when causal
  bool has_diagonal_offset = false;  // else bottom-right: kv_len - q_len per sequence
  std::int64_t diagonal_offset = 0;
  float softcap = 0.0f;   // 0: off
  bool deterministic = false;
  bool has_alibi = false;
  bool alibi_per_batch = false;  // slopes [B, Hq] rather than [Hq]
  bool has_sinks = false;        // sinks [Hq] join every row's softmax denominator
  float dropout_p = 0.0f;        // 0: off
  DropoutRng dropout;            // seed, offset and 16-bit keep threshold (philox.hpp)
  int probs_kv_len = 0;          // last dim of attn_probs: max_seqlen_k, or a cache's capacity

  bool has_dropout() const { return dropout_p > 0.0f; }
  // What a kept probability is multiplied by: 1 / (1 - dropout_p), 1 without dropout.
  float dropout_keep_scale() const { return has_dropout() ? 1.0f / (1.0f - dropout_p) : 1.0f; }

  // The caller's views, checked. Unused ones are empty.
  TensorView q, k, v, out, lse;
  TensorView dout, dq, dk, dv;  // backward
  TensorView k_new, v_new;      // KV-cache append
  TensorView alibi_slopes;
  TensorView sinks, dsinks;               // dsinks: backward output
  TensorView attn_probs;                  // forward debug output (S_dmask)
  TensorView cu_seqlens_q, cu_seqlens_k;  // varlen
  TensorView seqlens_k, block_table;      // KV cache (block_table also for paged_varlen())
  TensorView leftpad;                     // KV cache: int32 [B], with has_leftpad
  TensorView rotary_cos, rotary_sin;      // KV cache: [seqlen_ro, rotary_dim / 2], q's dtype

  // Host copies of the index tensors (for host tensors, and for GPU ones when
  // their contents were checked). Empty when the layout does not use them.
  std::vector<std::int32_t> host_cu_seqlens_q, host_cu_seqlens_k;
  std::vector<std::int32_t> host_seqlens_k;    // cached keys, before the append
  std::vector<std::int32_t> host_block_table;  // [batch * max_pages], row-major
  std::vector<std::int32_t> host_leftpad;      // [batch], with has_leftpad
  bool host_indices_valid = false;

  // Per-sequence lengths; need host_indices_valid for varlen and KV cache.
  int q_len(int b) const {
    if (layout == Layout::varlen) return host_cu_seqlens_q[b + 1] - host_cu_seqlens_q[b];
    return max_q_len;
  }
  int kv_len(int b) const {
    if (layout == Layout::varlen) return host_cu_seqlens_k[b + 1] - host_cu_seqlens_k[b];
    if (layout == Layout::kv_cache) return host_seqlens_k[b] + new_len;
    return max_kv_len;
  }
  // The keys sequence b sees before any mask are [kv_first(b), kv_len(b)):
  // in a KV cache with leftpad its keys start at cache row leftpad[b], and
  // key positions stay cache rows (so masks and ALiBi align as without it).
  // Needs host_indices_valid with leftpad.
  int kv_first(int b) const { return has_leftpad ? host_leftpad[b] : 0; }
  int group_size() const { return heads_q / heads_kv; }
  // Packed queries (varlen) over keys in a paged cache: k/v are [num_pages,
  // page_size, Hk, D], read through block_table; forward only.
  bool paged_varlen() const { return layout == Layout::varlen && paged; }
  // Rotary: whether query row i is rotated at seqlens_k[b] + i (a causal or
  // windowed call) rather than at seqlens_k[b] (rotary.hpp).
  bool rotary_positional_queries() const { return window_left >= 0 || window_right >= 0; }
};

// Merge of two partial attentions, checked.
struct MergeProblem {
  DType dtype = DType::f32;    // of out_a and out
  DType dtype_b = DType::f32;  // of out_b: dtype, or f16/bf16 when dtype is f32
  Device device{};
  int batch = 0, seq_len = 0, heads = 0, head_dim = 0;
  TensorView out_a, lse_a, out_b, lse_b, out, lse;
};

}  // namespace cuflash::detail
