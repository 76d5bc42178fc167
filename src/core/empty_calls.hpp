// Calls with a zero extent: a batch of no sequences, sequences of no queries or
// no keys, no heads, varlen batches of no packed rows. torch SDPA and
// flash-attn return empty results for them, and so does cuflash
// (docs/semantics.md, "Empty tensors"). Validation checks these tensors like
// any other; then the API asks work_of() whether a backend has to run at all.
#pragma once

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// Read from the shapes alone (varlen: also the declared max_seqlen_q/k; KV
// cache: its capacity), never from index contents, so that a workspace query,
// which reads no index, and the call it sizes agree.
//
// Some query row exists: B, heads_q and q_len (varlen: max_seqlen_q and the
// packed rows of q) are all >= 1.
bool has_query_rows(const Problem& problem);
// Some key can exist: B and heads_kv >= 1 and kv_len (varlen: max_seqlen_k
// and the packed rows of k; KV cache: its capacity and pages) >= 1.
bool has_keys(const Problem& problem);
// A KV-cache forward appends k_new/v_new rows (B, heads_kv, new_len >= 1).
bool has_append(const Problem& problem);

enum class Work {
  backend,         // the backend runs (a forward whose rows see no key included:
                   // it writes out = 0 and lse = -inf, as for any such row)
  nothing,         // forward without query rows or append: nothing to write
  zero_gradients,  // backward without a (query, key) pair: dq, dk, dv are all 0
};
Work work_of(const Problem& problem);

// merge_states of no rows (B, S or H = 0): nothing to write.
bool merge_has_rows(const MergeProblem& problem);

// Every element of `view` set to zero bits (0.0 in f32, f16 and bf16): host
// memory at once, GPU memory in order on `stream` (cudaMemset2DAsync, no
// kernel). A view without elements is left alone.
Status fill_zeros(const TensorView& view, void* stream);

}  // namespace cuflash::detail
