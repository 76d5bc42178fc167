// What one attention call looks like to cuDNN, derived from a Problem with no
// CUDA or cuDNN call (so the CPU tests check it): every tensor as cuDNN's
// [B, H, S, D] dims and strides, ragged per sequence for varlen; the mask as
// cuDNN's diagonal band; where the per-sequence lengths and the softmax stats
// come from; which fix-ups the call needs after cuDNN; and the layout of the
// scratch memory that follows cuDNN's own workspace. The graph key is made
// from the fields that shape the graph, and nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail::cudnn {

// The tensors of an SDPA graph. Stats is the softmax log-sum-exp (natural log,
// float32): written by the forward, read by the backward.
enum class Slot : int { q, k, v, o, stats, dout, dq, dk, dv };
inline constexpr int kSlots = 9;
inline constexpr int slot_index(Slot slot) { return static_cast<int>(slot); }
const char* slot_name(Slot slot);

// Which cu_seqlens delimits a ragged tensor's sequences.
enum class Side : int { q, kv };

struct TensorDesc {
  bool used = false;
  std::int64_t dim[4] = {};     // [B, H, S, D]
  std::int64_t stride[4] = {};  // elements
  // Varlen: sequence b's rows start at element cu_seqlens[b] * token_stride
  // (a ragged-offset tensor of B + 1 int64 that the backend computes).
  bool ragged = false;
  Side side = Side::q;
  std::int64_t token_stride = 0;
};

// Where a per-sequence length tensor (int32 [B], cuDNN's seq_len_q/kv) comes from.
enum class LengthSource : int {
  none,              // no padding mask
  constant,          // every sequence the same length: filled into scratch
  from_cu_seqlens,   // cu_seqlens[b + 1] - cu_seqlens[b]: computed into scratch
  caller_seqlens_k,  // the KV cache's seqlens_k, used as it is
};

// Where cuDNN writes (forward) or reads (backward) the stats.
enum class StatsPlace : int {
  none,            // forward without lse
  caller,          // the caller's lse, which is packed [B, Hq, Sq]
  scratch_dense,   // packed [B, Hq, Sq] in scratch, converted from / to the caller's lse
  scratch_ragged,  // varlen: token-major [total_q, Hq] in scratch, ragged by cu_seqlens_q
};

// Which SDPA node the cuDNN frontend builds: its composite graph of
// matmul/softmax/mask operations (what PyTorch uses), its unified SDPA
// operation (cuDNN >= 9.13.1), or the frontend's own choice. Composite unless
// the environment variable CUFLASH_CUDNN_SDPA says "unified" or "auto".
enum class SdpaNode : int { composite, unified, automatic };
SdpaNode sdpa_node_from_environment();

struct SdpaPlan {
  Pass pass = Pass::forward;
  Layout layout = Layout::dense;
  DType dtype = DType::f16;
  int device = 0;
  int batch = 0, heads_q = 0, heads_kv = 0, head_dim = 0;

  TensorDesc tensors[kSlots];
  const TensorDesc& tensor(Slot slot) const { return tensors[slot_index(slot)]; }
  TensorDesc& tensor(Slot slot) { return tensors[slot_index(slot)]; }

  // Padding mask: cuDNN masks rows >= seq_len_q[b] and keys >= seq_len_kv[b],
  // and aligns a bottom-right diagonal per sequence on those lengths.
  bool padding_mask = false;
  LengthSource q_lengths = LengthSource::none, kv_lengths = LengthSource::none;
  int q_len_constant = 0, kv_len_constant = 0;

  // The diagonal band in cuDNN's terms: key j is kept for query i when
  // j <= i + shift + right_bound and j > i + shift - left_bound, where shift
  // is 0 (top-left) or kv_len - q_len (bottom-right). -1: no such bound.
  // Our window (left, right) is left_bound = window_left + 1, right_bound = window_right.
  bool bottom_right = false;
  int left_bound = -1;
  int right_bound = -1;

  bool generate_stats = false;  // forward: cuDNN writes the stats
  StatsPlace stats = StatsPlace::none;
  bool deterministic = false;  // backward

  // Paged KV cache: K/V are [num_pages, Hk, page_size, D] containers read
  // through page tables [B, 1, page_table_cols, 1] (the caller's block_table).
  bool paged = false;
  std::int64_t page_table_cols = 0, page_table_row_stride = 0;
  std::int64_t max_seq_len_kv = 0;

  SdpaNode node = SdpaNode::composite;

  // After cuDNN: rows that see no key get out = 0 and lse = -inf (forward) or
  // dq = 0 (backward); keys that no query sees get dk = dv = 0 (backward).
  // cuDNN's own result for those is not what our semantics say, or not known to be.
  bool fix_empty_rows = false;
  bool fix_unseen_keys = false;

  // Scratch after cuDNN's workspace: byte offsets from its start (kNone: not used).
  static constexpr std::size_t kNone = ~std::size_t{0};
  struct Scratch {
    std::size_t q_lengths = kNone, kv_lengths = kNone;  // int32 [B]
    std::size_t offsets[kSlots] = {kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone, kNone};  // int64 [B + 1]
    std::size_t stats = kNone;  // float32
    std::size_t bytes = 0;
  } scratch;

  bool any_ragged() const;
  // Index tensors the backend computes into scratch before cuDNN runs.
  bool needs_index_kernel() const {
    return q_lengths == LengthSource::constant || q_lengths == LengthSource::from_cu_seqlens ||
           kv_lengths == LengthSource::constant || kv_lengths == LengthSource::from_cu_seqlens || any_ragged();
  }
};

// The cuDNN view of a problem that CudnnBackend::supports accepted (dtype,
// head dim, options, alignment): never fails for those.
SdpaPlan make_plan(const Problem& problem);

// Varlen graphs are built for max lengths rounded up to a power of two (at
// least 64): cuDNN takes the true lengths from seq_len tensors, so one graph
// serves every batch whose longest sequence falls in the same bucket.
std::int64_t varlen_length_bucket(int max_len);

// Every field that shapes the cuDNN graph (dims, strides, dtype, masks, stats,
// paging, node, device); two plans with equal keys run the same graph.
std::vector<std::int64_t> graph_key(const SdpaPlan& plan);

// "forward dense bf16 B=2 Hq=4 Hk=2 D=64 S=37x53 causal-br" style, for logs.
std::string describe(const SdpaPlan& plan);

}  // namespace cuflash::detail::cudnn
