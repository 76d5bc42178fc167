// Exact softmax attention, forward and backward, over dense batches, varlen
// (packed) batches and KV caches (contiguous or paged).
//
// Shapes (last dimension contiguous, any other strides):
//   dense:   q [B, q_len, Hq, D]      k, v [B, kv_len, Hk, D]
//   varlen:  q [total_q, Hq, D]       k, v [total_kv, Hk, D]
//            with cu_seqlens_q/k int32 [B+1]
//   kvcache: q [B, q_len, Hq, D]      k, v cache [B, capacity, Hk, D]
//            or paged: [num_pages, page_size, Hk, D] with block_table int32
//            [B, max_pages]; seqlens_k int32 [B] keys already cached;
//            optional k_new, v_new [B, new_len, Hk, D] written into the cache
//            at positions seqlens_k[b].. before attending; optional
//            leftpad int32 [B] and a rotary embedding (KvCache below).
//   varlen with keys in pages (flash-attn's paged prefill), forward only:
//            q [total_q, Hq, D] with cu_seqlens_q/k as varlen, k, v a paged
//            cache [num_pages, page_size, Hk, D] with kv_cache.block_table
//            [B, >= ceil(max_b len_k(b) / page_size)] and no other kv_cache
//            field; len_k(b) = cu_seqlens_k[b+1] - cu_seqlens_k[b] counts the
//            keys (not packed rows): key j of sequence b is in page
//            block_table[b][j / page_size], slot j % page_size. Otherwise a
//            varlen call (masks bottom-right per sequence, lse [Hq, total_q]).
//   out like q; lse float32 [B, Hq, q_len] (varlen: [Hq, total_q]), natural log.
// Hq must be a multiple of Hk (GQA/MQA). A query row with no visible key gets
// out = 0 and lse = -inf.
// Empty tensors, as in torch SDPA and flash-attn: every extent but head_dim may
// be 0 (B, q_len, kv_len, heads, packed rows; cu_seqlens = [0] is a batch of
// no sequence), and a view without elements may have a null data pointer. A
// call with no query row writes nothing; rows without keys get out = 0 and
// lse = -inf; a backward without any (query, key) pair writes dq = dk = dv = 0.
// Such calls run no kernel and need no workspace (docs/semantics.md, "Empty tensors").
#pragma once

#include <cstddef>

#include "cuflash/options.hpp"
#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash {

// Packed variable-length batch: sequence b holds rows
// cu_seqlens[b] .. cu_seqlens[b+1]-1 of the packed tensors.
struct VarlenBatch {
  TensorView cu_seqlens_q;  // int32 [B+1]
  TensorView cu_seqlens_k;  // int32 [B+1]
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;

  bool given() const { return !cu_seqlens_q.empty() || !cu_seqlens_k.empty(); }
};

// A KV cache: k and v are the cache itself.
struct KvCache {
  TensorView seqlens_k;    // int32 [B]: keys already in the cache per sequence
  TensorView block_table;  // int32 [B, max_pages]; empty for a contiguous cache
  TensorView k_new;        // optional [B, new_len, Hk, D], appended (forward only)
  TensorView v_new;
  // Optional int32 [B] (flash-attn's cache_leftpad): the cache row where
  // sequence b's keys start; rows before leftpad[b] are no key of it, so it
  // sees rows leftpad[b] <= j < seqlens_k[b] + new_len. Masks and ALiBi keep
  // their bottom-right alignment on those rows (in cache rows: key j is
  // aligned with query i when j = i + seqlens_k[b] + new_len - q_len, as
  // without leftpad). 0 <= leftpad[b] <= seqlens_k[b]. With block_table too
  // (flash-attn refuses that pair): rows are key positions the table maps.
  TensorView leftpad;
  // Optional rotary embedding of q and k_new (flash-attn's rotary_cos /
  // rotary_sin), given together and only with k_new: [seqlen_ro, rotary_dim / 2]
  // in q's dtype, rotary_dim <= head_dim, seqlen_ro at least the cache's
  // capacity. Appended row n of sequence b is rotated at position
  // seqlens_k[b] + n and written into the cache rotated; query row i at
  // seqlens_k[b] + i when the call is causal or has a window, else at
  // seqlens_k[b]. Columns c < rotary_dim pair with c + rotary_dim / 2
  // (GPT-NeoX halves) or, with rotary_interleaved, c ^ 1 (GPT-J pairs);
  // columns >= rotary_dim are not rotated. Computed in fp32, rounded once to
  // the dtype (docs/semantics.md, "Rotary embedding").
  TensorView rotary_cos;
  TensorView rotary_sin;
  bool rotary_interleaved = false;

  bool given() const {
    return !seqlens_k.empty() || !block_table.empty() || !k_new.empty() || !v_new.empty() || !leftpad.empty() ||
           !rotary_cos.empty() || !rotary_sin.empty();
  }
};

struct ForwardArgs {
  TensorView q, k, v;
  TensorView out;
  TensorView lse;           // optional
  TensorView alibi_slopes;  // optional float32 [Hq] or [B, Hq]; bias -slope*|i + kv_len - q_len - j|
  // Optional float32 [Hq]: attention sinks (gpt-oss), one logit per query head
  // that joins every row's softmax denominator but has no value:
  //   p_ij = exp(s_ij - lse_i), lse_i = log(exp(sinks[h]) + sum_j exp(s_ij)).
  // A row that sees no key gets out = 0 and lse = sinks[h].
  TensorView sinks;
  // Optional debug output, float32 [B, Hq, max_seqlen_q, max_kv] (max_kv: kv_len
  // dense, max_seqlen_k varlen, the cache's capacity for a KV cache): the
  // normalized probabilities p_ij, with the entries dropout dropped negated
  // (sign bit set); 0 where j is not visible or outside the sequence. flash-attn's
  // S_dmask, for tests: backend cpu only.
  TensorView attn_probs;
  VarlenBatch varlen;       // given: varlen layout
  KvCache kv_cache;         // given: KV-cache layout (with varlen: block_table only, keys in pages)
};

struct BackwardArgs {
  TensorView q, k, v, out, dout;
  TensorView lse;           // float32, as written by the forward
  TensorView dq, dk, dv;    // dq like q, dk/dv like k/v
  TensorView alibi_slopes;
  TensorView sinks;         // as given to the forward
  // Optional output float32 [Hq], with sinks only: d(loss)/d(sinks[h]) =
  //   -sum over (b, i) of exp(sinks[h] - lse) * dot(dout_i, out_i).
  TensorView dsinks;
  VarlenBatch varlen;
  KvCache kv_cache;         // k_new/v_new and rotary_cos/rotary_sin empty: appends are forward-only; none with varlen
};

Status attention_forward(const ForwardArgs& args, const AttentionOptions& options = {},
                         const RunContext& context = {});
Status attention_backward(const BackwardArgs& args, const AttentionOptions& options = {},
                          const RunContext& context = {});

// Scratch bytes a call needs in RunContext::workspace (0 for the CPU backend).
Status forward_workspace_size(const ForwardArgs& args, const AttentionOptions& options,
                              std::size_t* bytes);
Status backward_workspace_size(const BackwardArgs& args, const AttentionOptions& options,
                               std::size_t* bytes);

}  // namespace cuflash
