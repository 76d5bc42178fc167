// The float64 oracle: naive, unfused attention in double precision, written
// for obviousness rather than speed. Tests and `cuflash run` measure every
// backend (the CPU backend included) against it. Same semantics as the API.
#pragma once

#include <vector>

#include "cuflash/attention.hpp"

namespace cuflash::oracle {

struct ForwardResult {
  std::vector<double> out;  // out's logical shape, row-major
  std::vector<double> lse;  // [B, Hq, q_len] (varlen: [Hq, total_q]); -inf for rows that see no key (and no sink)
  // With args.attn_probs given: its logical shape [B, Hq, max_seqlen_q, max_kv],
  // the probabilities with dropped entries negated, 0 outside the sequences.
  std::vector<double> attn_probs;
  // With a rotary embedding (kv_cache.rotary_cos/sin): k_new's logical shape,
  // its rows as the append writes them into the cache (rotated, rounded to the
  // cache's dtype). Empty otherwise: the append copies k_new as it is.
  std::vector<double> k_appended;
};

struct BackwardResult {
  std::vector<double> dq;  // q's logical shape, row-major
  // dq's terms before they cancel: sum_j |scale dS_ij k_jd|, q's shape. A
  // row's dS sums to 0 (without dropout), so its dq is a cancelling sum and
  // this, not |dq|, is what a rounding of dS is relative to.
  std::vector<double> dq_terms;
  std::vector<double> dk;  // k's logical shape (the whole cache for a KV cache), row-major
  std::vector<double> dv;
  std::vector<double> dsinks;  // [Hq], with sinks given
};

// Host tensors of any supported dtype and strides. Validates like the API.
// Sinks and dropout as the API defines them (dropout's mask is the one
// definition in src/core/philox.hpp). A KV-cache append is applied virtually: the cache is not modified.
// A KV cache's leftpad and rotary embedding as the API defines them, computed here on their own.
Status forward_float64(const ForwardArgs& args, const AttentionOptions& options, ForwardResult* result);
// Recomputes everything from q, k, v, dout (args.out and args.lse are ignored;
// args.dq/dk/dv must still be given, as shape templates, and are not written).
Status backward_float64(const BackwardArgs& args, const AttentionOptions& options, BackwardResult* result);

}  // namespace cuflash::oracle
