// One attention test case: a description (CaseSpec) and the host tensors it
// builds from fresh random values (AttentionCase), in any of the three
// layouts, ready to hand to the API or to the float64 oracle.
#pragma once

#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuflash/attention.hpp"
#include "test_tensors.hpp"

namespace cuflash::test {

enum class CaseLayout { dense, varlen, kv_cache };
enum class AlibiKind { none, per_head, per_batch };  // slopes [Hq] or [B, Hq]

struct CaseSpec {
  std::string label;  // part of the gtest name: letters, digits, '_'
  DType dtype = DType::f32;
  CaseLayout layout = CaseLayout::dense;
  int batch = 1, heads_q = 1, heads_kv = 1, head_dim = 64;

  // dense: the lengths of every sequence; kv_cache: q_len of every sequence.
  int q_len = 1, kv_len = 1;
  // varlen: per-sequence lengths (batch is their count).
  std::vector<int> q_lens, kv_lens;
  int extra_rows = 0;  // varlen: packed rows after cu_seqlens[B], owned by no sequence

  // kv_cache: keys already cached per sequence (batch is their count), and
  // keys appended from k_new/v_new.
  std::vector<int> cached_lens;
  int new_len = 0;
  // kv_cache: 0 is a contiguous cache [B, capacity, Hk, D]. varlen: > 0 puts
  // the keys in a paged cache instead of packed k/v (flash-attn's paged
  // prefill: kv_lens[b] keys from block_table[b], counted by cu_seqlens_k).
  int page_size = 0;
  int guard_pages = 2;              // paged: pages no block table references
  int capacity_slack = 3;           // contiguous: slots after the longest sequence
  bool share_first_page = false;    // paged: every sequence's first page is sequence 0's (prefix cache)
  // kv_cache: flash-attn's cache_leftpad per sequence (empty: none); the cache
  // rows before it hold no key of the sequence (NaN with poison_unused).
  std::vector<int> leftpad;
  // kv_cache: rotary embedding of q and k_new over this many columns (0: none),
  // GPT-NeoX halves or interleaved GPT-J pairs; cos/sin tables of the usual
  // frequencies, in the case's dtype.
  int rotary_dim = 0;
  bool rotary_interleaved = false;

  bool bhsd = false;  // q/k/v/out/dout/dq/dk/dv in BHSD (varlen: HTD) memory, viewed as BSHD
  int row_padding = 0;  // and/or with this many unused elements after every head_dim row
  bool with_lse = true;
  AlibiKind alibi = AlibiKind::none;
  bool sinks = false;  // attention sinks [Hq] (and their gradient dsinks in the backward)
  AttentionOptions options;
  // Rows and cache slots no sequence owns hold NaN, so that reading them shows.
  bool poison_unused = true;
  double input_std = 1.0;

  std::string name() const;  // label + dtype
};

const char* dtype_label(DType dtype);

// For parameterized tests: readable parameters and names.
void PrintTo(const CaseSpec& spec, std::ostream* os);
struct CaseSpecName {
  std::string operator()(const ::testing::TestParamInfo<CaseSpec>& info) const { return info.param.name(); }
};
// Each spec once per dtype.
std::vector<CaseSpec> for_dtypes(const std::vector<CaseSpec>& specs, const std::vector<DType>& dtypes);
// A dense case: `batch` sequences of q_len queries over kv_len keys.
CaseSpec dense_case(std::string label, int q_len, int kv_len, int heads_q, int heads_kv, int head_dim, int batch = 2);
// `base` under another label, changed by `change(CaseSpec&)`: for lists of
// cases that vary one shape.
template <typename Change>
CaseSpec variant(CaseSpec base, std::string label, Change change) {
  base.label = std::move(label);
  change(base);
  return base;
}

class AttentionCase {
 public:
  AttentionCase(CaseSpec spec, std::mt19937& engine);

  const CaseSpec& spec() const { return spec_; }
  int batch() const;
  // Options for `backend` (the spec's options otherwise).
  AttentionOptions options(Backend backend) const;

  ForwardArgs forward_args() const;
  // Backward arguments: out/lse must have been set (set_forward_outputs).
  BackwardArgs backward_args() const;
  // Writes a float64 forward result into out/lse (rounded to their dtypes) as
  // the backward's inputs (lse is created if the forward had none).
  void set_forward_outputs(const std::vector<double>& out, const std::vector<double>& lse);

  // Packed rows / keys per sequence, as the case laid them out.
  int q_len(int b) const;
  int kv_len(int b) const;    // kv_cache: cached + new
  int kv_first(int b) const;  // kv_cache: the leftpad (0 without one); else 0
  // kv_cache (and varlen with pages): the (page or batch, slot) row of the
  // cache that holds key j of sequence b.
  struct CacheRow {
    std::int64_t outer, pos;
  };
  CacheRow cache_row(int b, int j) const;
  // varlen with pages: the same case with each sequence's keys copied out of
  // the pages into packed k/v (no block table), the call whose results a
  // paged varlen call must reproduce; out/lse as they are now.
  AttentionCase with_packed_keys() const;
  // Whether logical element `index` of q (and out, dout, dq) belongs to a sequence.
  std::vector<bool> q_rows_owned() const;

  HostTensor q, k, v, out, lse;
  HostTensor dout, dq, dk, dv;
  HostTensor alibi;
  HostTensor sinks, dsinks;  // f32 [Hq] when spec().sinks
  HostTensor cu_seqlens_q, cu_seqlens_k;
  HostTensor seqlens_k, block_table, k_new, v_new;
  HostTensor leftpad;                // i32 [B] when spec().leftpad is given
  HostTensor rotary_cos, rotary_sin;  // [seqlen_ro, rotary_dim / 2] when spec().rotary_dim > 0
  std::vector<int> block_table_values;  // [B * max_pages]
  int max_pages = 0;

 private:
  void build_dense(std::mt19937& engine);
  void build_varlen(std::mt19937& engine);
  void build_kv_cache(std::mt19937& engine);
  // Paged k/v of page_size slots for sequences of up to `longest` keys, pages
  // handed out shuffled, and the block table.
  void build_pages(int longest, std::mt19937& engine);
  int stored_keys(int b) const;  // keys in the cache before the call
  void build_common(std::mt19937& engine);
  void build_rotary_tables();
  MemoryLayout qkv_layout(int rank) const;
  void poison_unowned_cache_slots();
  std::vector<bool> q_rows_owned_by_row() const;  // per [H, D] row of q

  CaseSpec spec_;
};

}  // namespace cuflash::test
