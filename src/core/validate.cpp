#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "index_copy.hpp"
#include "tensor_checks.hpp"

namespace cuflash::detail {

namespace {

constexpr const char* kDenseQ = "[batch, seqlen_q, heads_q, head_dim]";
constexpr const char* kDenseKv = "[batch, seqlen_k, heads_kv, head_dim]";
constexpr const char* kVarlenQ = "[total_q, heads_q, head_dim]";
constexpr const char* kVarlenKv = "[total_k, heads_kv, head_dim]";
constexpr const char* kPagedKv = "[num_pages, page_size, heads_kv, head_dim]";
constexpr const char* kCacheKv = "[batch, capacity, heads_kv, head_dim]";
constexpr const char* kNewKv = "[batch, new_len, heads_kv, head_dim]";
constexpr const char* kDenseLse = "[batch, heads_q, seqlen_q]";
constexpr const char* kVarlenLse = "[heads_q, total_q]";

std::string str(std::int64_t value) { return std::to_string(value); }

bool is_float(DType dtype) { return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16; }

const char* q_doc(const Problem& p) { return p.layout == Layout::varlen ? kVarlenQ : kDenseQ; }
const char* kv_doc(const Problem& p) {
  if (p.paged) return kPagedKv;  // a KV cache or a varlen call's keys in pages
  if (p.layout == Layout::varlen) return kVarlenKv;
  if (p.layout == Layout::kv_cache) return kCacheKv;
  return kDenseKv;
}

// q, k, v: presence, layout, dtype, device; fills the problem's geometry.
Status check_qkv(const TensorView& q, const TensorView& k, const TensorView& v, Problem* p) {
  const bool varlen = p->layout == Layout::varlen;
  const int q_rank = varlen ? 3 : 4;
  const int kv_rank = varlen && !p->paged ? 3 : 4;

  CUFLASH_TRY(check_query_key_value(q, k, v, q_rank, kv_rank, {q_doc(*p), kv_doc(*p), kv_doc(*p)}, "head_dim"));
  if (p->layout == Layout::dense && k.shape[0] != q.shape[0])
    return Status::invalid("k: dim 0 (batch) expected " + str(q.shape[0]) + " (like q), got " + str(k.shape[0]));
  for (int d = 0; d < kv_rank; ++d)
    if (v.shape[d] != k.shape[d])
      return Status::invalid("v: expected shape " + shape_string(k) + " (like k), got " + shape_string(v));

  p->dtype = q.dtype;
  p->device = q.device;
  p->heads_q = static_cast<int>(q.shape[q_rank - 2]);
  p->heads_kv = static_cast<int>(k.shape[kv_rank - 2]);
  p->head_dim = static_cast<int>(q.shape[q_rank - 1]);
  if (p->layout != Layout::varlen) {
    p->batch = static_cast<int>(q.shape[0]);
    p->max_q_len = static_cast<int>(q.shape[1]);
  }
  if (p->layout == Layout::dense) p->max_kv_len = static_cast<int>(k.shape[1]);
  p->q = q;
  p->k = k;
  p->v = v;
  return {};
}

Status check_lse(const TensorView& lse, const char* name, const Problem& p) {
  const bool varlen = p.layout == Layout::varlen;
  const char* doc = varlen ? kVarlenLse : kDenseLse;
  CUFLASH_TRY(check_layout(lse, name, varlen ? 2 : 3, doc, false));
  CUFLASH_TRY(check_dtype(lse, name, DType::f32, "log-sum-exp is always float32"));
  CUFLASH_TRY(check_device(lse, name, p.device));
  if (varlen) return check_dims(lse, name, {{"heads_q", p.heads_q}, {"total_q", p.q.shape[0]}}, "from q");
  return check_dims(lse, name, {{"batch", p.batch}, {"heads_q", p.heads_q}, {"seqlen_q", p.max_q_len}}, "from q");
}

Status check_alibi(const TensorView& slopes, Problem* p) {
  if (slopes.empty()) return {};
  if (slopes.rank != 1 && slopes.rank != 2)
    return Status::invalid("alibi_slopes: expected rank 1 [heads_q] or rank 2 [batch, heads_q], got rank " +
                           str(slopes.rank));
  CUFLASH_TRY(check_layout(slopes, "alibi_slopes", slopes.rank, "[heads_q] or [batch, heads_q]", false));
  CUFLASH_TRY(check_dtype(slopes, "alibi_slopes", DType::f32, "slopes are float32"));
  CUFLASH_TRY(check_device(slopes, "alibi_slopes", p->device));
  if (slopes.rank == 1) CUFLASH_TRY(check_dims(slopes, "alibi_slopes", {{"heads_q", p->heads_q}}, "from q"));
  else CUFLASH_TRY(check_dims(slopes, "alibi_slopes", {{"batch", p->batch}, {"heads_q", p->heads_q}}, "from q"));
  p->has_alibi = true;
  p->alibi_per_batch = slopes.rank == 2;
  p->alibi_slopes = slopes;
  return {};
}

// Attention sinks, and their gradient (an output, like sinks).
Status check_sinks(const TensorView& view, const char* name, const Problem& p) {
  CUFLASH_TRY(check_layout(view, name, 1, "[heads_q]", false));
  CUFLASH_TRY(check_dtype(view, name, DType::f32, "sinks are float32"));
  CUFLASH_TRY(check_device(view, name, p.device));
  return check_dims(view, name, {{"heads_q", p.heads_q}}, "from q");
}

// The debug output of the forward's probabilities: [B, Hq, max_seqlen_q, max_kv].
Status check_attn_probs(const TensorView& view, Problem* p) {
  p->probs_kv_len = p->layout == Layout::kv_cache ? p->cache_capacity : p->max_kv_len;
  CUFLASH_TRY(check_layout(view, "attn_probs", 4, "[batch, heads_q, max_seqlen_q, max_seqlen_k]", false));
  CUFLASH_TRY(check_dtype(view, "attn_probs", DType::f32, "probabilities are float32"));
  CUFLASH_TRY(check_device(view, "attn_probs", p->device));
  const char* keys = p->layout == Layout::kv_cache ? "cache_capacity" : "max_seqlen_k";
  CUFLASH_TRY(check_dims(view, "attn_probs",
                         {{"batch", p->batch}, {"heads_q", p->heads_q}, {"max_seqlen_q", p->max_q_len},
                          {keys, p->probs_kv_len}},
                         "from q and k"));
  CUFLASH_TRY(check_no_self_overlap(view, "attn_probs"));
  p->attn_probs = view;
  return {};
}

Status check_index_layout(const TensorView& view, const char* name, int rank, const char* doc, Device device) {
  CUFLASH_TRY(check_given(view, name));
  CUFLASH_TRY(check_layout(view, name, rank, doc, true));
  CUFLASH_TRY(check_dtype(view, name, DType::i32, "index tensors are int32"));
  return check_device(view, name, device);
}

// Offsets of one side of a varlen batch: 0, non-decreasing, within the packed rows.
// Keys in pages are not packed: their cu_seqlens_k only counts them (flash-attn's
// convention), with kNoPackedRows as the bound; the block table bounds each sequence.
constexpr std::int64_t kNoPackedRows = std::numeric_limits<std::int64_t>::max();
Status check_cu_seqlens(const std::vector<std::int32_t>& offsets, const char* name, std::int64_t total_rows,
                        const char* rows_name, int max_seqlen, const char* max_name) {
  const std::string arg = std::string("varlen.") + name;
  if (offsets[0] != 0) return Status::invalid(arg + ": expected " + name + "[0] == 0, got " + str(offsets[0]));
  int longest = 0;
  for (std::size_t b = 1; b < offsets.size(); ++b) {
    if (offsets[b] < offsets[b - 1])
      return Status::invalid(arg + ": must be non-decreasing, but " + name + "[" + str(b) + "] = " + str(offsets[b]) +
                             " < " + name + "[" + str(b - 1) + "] = " + str(offsets[b - 1]));
    longest = std::max(longest, offsets[b] - offsets[b - 1]);
  }
  if (offsets.back() > total_rows)
    return Status::invalid(arg + ": " + name + "[" + str(offsets.size() - 1) + "] = " + str(offsets.back()) +
                           " exceeds the " + str(total_rows) + " packed rows of " + rows_name);
  if (longest > max_seqlen)
    return Status::invalid(std::string("varlen.") + max_name + ": expected >= " + str(longest) +
                           " (the longest sequence in " + name + "), got " + str(max_seqlen));
  return {};
}

// A paged cache's geometry: k/v [num_pages, page_size, Hk, D] read through
// block_table [batch, max_pages]; a sequence holds up to max_pages x page_size keys.
Status check_page_table_layout(const TensorView& block_table, Problem* p) {
  CUFLASH_TRY(check_index_layout(block_table, "kv_cache.block_table", 2, "[batch, max_pages]", p->device));
  CUFLASH_TRY(check_dims(block_table, "kv_cache.block_table", {{"batch", p->batch}, {"max_pages", -1}}, "from q"));
  if (block_table.shape[1] < 1 && p->batch > 0)
    return Status::invalid("kv_cache.block_table: expected at least one page per sequence, got shape " +
                           shape_string(block_table));
  if (p->k.shape[1] < 1)
    return Status::invalid("k: page_size (dim 1 of a paged cache " + std::string(kPagedKv) +
                           ") must be >= 1, got shape " + shape_string(p->k));
  p->page_size = static_cast<int>(p->k.shape[1]);
  p->num_pages = static_cast<int>(p->k.shape[0]);
  p->max_pages = static_cast<int>(block_table.shape[1]);
  const std::int64_t capacity = static_cast<std::int64_t>(p->page_size) * p->max_pages;
  if (capacity > std::numeric_limits<std::int32_t>::max())
    return Status::invalid("kv_cache.block_table: " + str(p->max_pages) + " pages x page_size " + str(p->page_size) +
                           " exceed 2^31 - 1 keys per sequence");
  p->cache_capacity = static_cast<int>(capacity);
  p->block_table = block_table;
  return {};
}

// Every page that the first kv_len keys of sequence b read lies inside the cache.
Status check_pages_in_cache(const Problem& p, int b, int kv_len) {
  const int pages_used = (kv_len + p.page_size - 1) / p.page_size;
  for (int page = 0; page < pages_used; ++page) {
    const std::int32_t entry = p.host_block_table[static_cast<std::size_t>(b) * p.max_pages + page];
    if (entry < 0 || entry >= p.num_pages)
      return Status::invalid("kv_cache.block_table: block_table[" + str(b) + "][" + str(page) + "] = " + str(entry) +
                             " is out of range [0, " + str(p.num_pages) + ") (pages in k)");
  }
  return {};
}

// A varlen call whose keys are in pages: each sequence's cu_seqlens_k count
// fits its block-table row, and every page it reads is in the cache.
Status check_paged_varlen_contents(const TensorView& block_table, void* stream, Problem* p) {
  CUFLASH_TRY(copy_index_tensor(block_table, "kv_cache.block_table", stream, &p->host_block_table));
  for (int b = 0; b < p->batch; ++b) {
    const int kv_len = p->kv_len(b);
    if (kv_len > p->cache_capacity)
      return Status::invalid("kv_cache.block_table: sequence " + str(b) + " has " + str(kv_len) +
                             " keys (cu_seqlens_k), more than its " + str(p->max_pages) + " pages x page_size " +
                             str(p->page_size) + " hold; expected at least " +
                             str((kv_len + p->page_size - 1) / p->page_size) + " columns");
    CUFLASH_TRY(check_pages_in_cache(*p, b, kv_len));
  }
  return {};
}

// Varlen: cu_seqlens on both sides; with p->paged the keys are in a paged
// cache (kv_cache.block_table) instead of packed rows of k/v.
Status check_varlen(const VarlenBatch& varlen, const TensorView& block_table, const AttentionOptions& options,
                    void* stream, Problem* p) {
  CUFLASH_TRY(check_index_layout(varlen.cu_seqlens_q, "varlen.cu_seqlens_q", 1, "[batch + 1]", p->device));
  CUFLASH_TRY(check_index_layout(varlen.cu_seqlens_k, "varlen.cu_seqlens_k", 1, "[batch + 1]", p->device));
  const std::int64_t entries = varlen.cu_seqlens_q.shape[0];
  // One entry, [0], is a batch of no sequences.
  if (entries < 1) return Status::invalid("varlen.cu_seqlens_q: expected at least 1 entry [batch + 1], got " + str(entries));
  CUFLASH_TRY(check_dims(varlen.cu_seqlens_k, "varlen.cu_seqlens_k", {{"batch + 1", entries}}, "like cu_seqlens_q"));
  if (varlen.max_seqlen_q < 0) return Status::invalid("varlen.max_seqlen_q: expected >= 0, got " + str(varlen.max_seqlen_q));
  if (varlen.max_seqlen_k < 0) return Status::invalid("varlen.max_seqlen_k: expected >= 0, got " + str(varlen.max_seqlen_k));
  p->batch = static_cast<int>(entries - 1);
  p->max_q_len = varlen.max_seqlen_q;
  p->max_kv_len = varlen.max_seqlen_k;
  p->cu_seqlens_q = varlen.cu_seqlens_q;
  p->cu_seqlens_k = varlen.cu_seqlens_k;
  if (p->paged) CUFLASH_TRY(check_page_table_layout(block_table, p));
  if (p->device.kind == DeviceKind::cuda && !options.check_index_contents) return {};

  CUFLASH_TRY(copy_index_tensor(varlen.cu_seqlens_q, "varlen.cu_seqlens_q", stream, &p->host_cu_seqlens_q));
  CUFLASH_TRY(copy_index_tensor(varlen.cu_seqlens_k, "varlen.cu_seqlens_k", stream, &p->host_cu_seqlens_k));
  CUFLASH_TRY(check_cu_seqlens(p->host_cu_seqlens_q, "cu_seqlens_q", p->q.shape[0], "q", varlen.max_seqlen_q, "max_seqlen_q"));
  CUFLASH_TRY(check_cu_seqlens(p->host_cu_seqlens_k, "cu_seqlens_k", p->paged ? kNoPackedRows : p->k.shape[0], "k",
                               varlen.max_seqlen_k, "max_seqlen_k"));
  if (p->paged) CUFLASH_TRY(check_paged_varlen_contents(block_table, stream, p));
  p->host_indices_valid = true;
  return {};
}

// The cache's shape facts, before its contents: page size, capacity, append.
Status check_kv_cache_layout(const KvCache& cache, bool forward, Problem* p) {
  CUFLASH_TRY(check_index_layout(cache.seqlens_k, "kv_cache.seqlens_k", 1, "[batch]", p->device));
  CUFLASH_TRY(check_dims(cache.seqlens_k, "kv_cache.seqlens_k", {{"batch", p->batch}}, "from q"));
  if (p->paged) {
    CUFLASH_TRY(check_page_table_layout(cache.block_table, p));
  } else {
    if (p->k.shape[0] != p->batch)
      return Status::invalid("k: dim 0 (batch) of a contiguous KV cache expected " + str(p->batch) + " (like q), got " +
                             str(p->k.shape[0]));
    p->page_size = static_cast<int>(p->k.shape[1]);
    p->num_pages = p->batch;
    p->max_pages = 1;
    p->cache_capacity = p->page_size;
  }
  p->seqlens_k = cache.seqlens_k;
  if (!cache.leftpad.empty()) {
    // With a paged cache too (flash-attn refuses that pair): the leftpad counts
    // key positions, which the block table maps to rows like any other key.
    CUFLASH_TRY(check_index_layout(cache.leftpad, "kv_cache.leftpad", 1, "[batch]", p->device));
    CUFLASH_TRY(check_dims(cache.leftpad, "kv_cache.leftpad", {{"batch", p->batch}}, "from q"));
    p->has_leftpad = true;
    p->leftpad = cache.leftpad;
  }

  if (cache.k_new.empty() != cache.v_new.empty())
    return Status::invalid(cache.k_new.empty() ? "kv_cache.k_new: required with v_new but not given"
                                               : "kv_cache.v_new: required with k_new but not given");
  if (cache.k_new.empty()) return {};
  if (!forward)
    return Status::invalid("kv_cache.k_new: appends are forward-only; backward takes the cache as the forward read it");
  CUFLASH_TRY(check_given(cache.k_new, "kv_cache.k_new"));
  for (const auto& [name, view] : {std::pair{"kv_cache.k_new", cache.k_new}, std::pair{"kv_cache.v_new", cache.v_new}}) {
    CUFLASH_TRY(check_layout(view, name, 4, kNewKv, true));
    CUFLASH_TRY(check_dtype(view, name, p->dtype, "same as q"));
    CUFLASH_TRY(check_device(view, name, p->device));
    CUFLASH_TRY(check_dims(view, name, {{"batch", p->batch}, {"new_len", cache.k_new.shape[1]}, {"heads_kv", p->heads_kv},
                                        {"head_dim", p->head_dim}},
                           "from q, k and k_new"));
  }
  p->new_len = static_cast<int>(cache.k_new.shape[1]);
  p->k_new = cache.k_new;
  p->v_new = cache.v_new;
  return {};
}

// The slots one sequence's append writes in one page: [first_slot, end_slot).
struct AppendRange {
  std::int32_t page;
  int first_slot, end_slot;
  int b, table_index;
};

// No two appended keys may land in the same cache slot: two sequences whose
// block tables share a page both appending into the same slots of it, or one
// table listing a page twice. On the GPU the writes would race; even where
// they do not (the CPU), the cache would depend on the order of sequences.
// Works on page ranges, sorted, so a long chunk costs pages, not keys.
Status check_append_slots_distinct(const Problem& p) {
  std::vector<AppendRange> ranges;
  for (int b = 0; b < p.batch; ++b) {
    const int end = p.host_seqlens_k[b] + p.new_len;
    for (int j = p.host_seqlens_k[b]; j < end;) {
      const int table_index = j / p.page_size;
      const int stop = std::min(end, (table_index + 1) * p.page_size);
      ranges.push_back({p.host_block_table[static_cast<std::size_t>(b) * p.max_pages + table_index], j % p.page_size,
                        (stop - 1) % p.page_size + 1, b, table_index});
      j = stop;
    }
  }
  std::sort(ranges.begin(), ranges.end(), [](const AppendRange& x, const AppendRange& y) {
    return x.page != y.page ? x.page < y.page : x.first_slot < y.first_slot;
  });
  // Within a page, sorted by first slot: a range overlaps an earlier one iff
  // it starts before the furthest end seen so far.
  std::size_t furthest = 0;
  for (std::size_t r = 1; r < ranges.size(); ++r) {
    if (ranges[r].page != ranges[r - 1].page) {
      furthest = r;
      continue;
    }
    const AppendRange& other = ranges[furthest];
    if (ranges[r].first_slot < other.end_slot) {
      const auto entry = [](const AppendRange& a) {
        return "sequence " + str(a.b) + " (block_table[" + str(a.b) + "][" + str(a.table_index) + "])";
      };
      return Status::invalid("kv_cache.block_table: " + entry(other) + " and " + entry(ranges[r]) +
                             " both append into page " + str(ranges[r].page) + " slot " + str(ranges[r].first_slot) +
                             "; appended keys must go to distinct cache slots");
    }
    if (ranges[r].end_slot > other.end_slot) furthest = r;
  }
  return {};
}

// Cache lengths within capacity (append included), every page a sequence
// reads inside the cache, and appends to distinct slots.
Status check_kv_cache_contents(const KvCache& cache, void* stream, Problem* p) {
  CUFLASH_TRY(copy_index_tensor(cache.seqlens_k, "kv_cache.seqlens_k", stream, &p->host_seqlens_k));
  if (p->paged) CUFLASH_TRY(copy_index_tensor(cache.block_table, "kv_cache.block_table", stream, &p->host_block_table));
  if (p->has_leftpad) CUFLASH_TRY(copy_index_tensor(cache.leftpad, "kv_cache.leftpad", stream, &p->host_leftpad));
  const std::string capacity_text = p->paged ? str(p->max_pages) + " pages x page_size " + str(p->page_size)
                                             : "the cache's dim 1";
  int longest = 0;
  for (int b = 0; b < p->batch; ++b) {
    const std::int32_t cached = p->host_seqlens_k[b];
    if (cached < 0)
      return Status::invalid("kv_cache.seqlens_k: seqlens_k[" + str(b) + "] = " + str(cached) + " is negative");
    if (cached > p->cache_capacity)
      return Status::invalid("kv_cache.seqlens_k: seqlens_k[" + str(b) + "] = " + str(cached) + " exceeds the capacity of " +
                             str(p->cache_capacity) + " keys per sequence (" + capacity_text + ")");
    if (static_cast<std::int64_t>(cached) + p->new_len > p->cache_capacity)
      return Status::invalid("kv_cache.k_new: appending " + str(p->new_len) + " keys to sequence " + str(b) + " (holding " +
                             str(cached) + ") overflows its capacity of " + str(p->cache_capacity) + " keys (" +
                             capacity_text + ")");
    if (p->has_leftpad && (p->host_leftpad[b] < 0 || p->host_leftpad[b] > cached))
      return Status::invalid("kv_cache.leftpad: leftpad[" + str(b) + "] = " + str(p->host_leftpad[b]) +
                             (p->host_leftpad[b] < 0 ? " is negative"
                                                     : " exceeds seqlens_k[" + str(b) + "] = " + str(cached) +
                                                           " (a sequence's keys start within its cached keys)"));
    const int kv_len = cached + p->new_len;
    longest = std::max(longest, kv_len);
    if (p->paged) CUFLASH_TRY(check_pages_in_cache(*p, b, kv_len));
  }
  if (p->paged && p->new_len > 0) CUFLASH_TRY(check_append_slots_distinct(*p));
  p->max_kv_len = longest;
  p->host_indices_valid = true;
  return {};
}

Status check_kv_cache(const KvCache& cache, const AttentionOptions& options, bool forward, void* stream, Problem* p) {
  CUFLASH_TRY(check_kv_cache_layout(cache, forward, p));
  if (p->device.kind == DeviceKind::cuda && !options.check_index_contents) {
    p->max_kv_len = p->cache_capacity;  // an upper bound; kernels read the true lengths
    return {};
  }
  return check_kv_cache_contents(cache, stream, p);
}

// The rotary embedding of q and k_new; after resolve_options (whether queries
// are rotated at their own positions depends on the mask).
Status check_rotary(const KvCache& cache, bool forward, Problem* p) {
  if (cache.rotary_cos.empty() && cache.rotary_sin.empty()) return {};
  if (cache.rotary_cos.empty() || cache.rotary_sin.empty())
    return Status::invalid(cache.rotary_cos.empty() ? "kv_cache.rotary_cos: required with rotary_sin but not given"
                                                    : "kv_cache.rotary_sin: required with rotary_cos but not given");
  if (!forward)
    return Status::invalid("kv_cache.rotary_cos: the rotary embedding is part of a forward's append; a backward "
                           "takes q and the cache as the forward attended to them (rotated)");
  if (cache.k_new.empty())
    return Status::invalid("kv_cache.rotary_cos: needs kv_cache.k_new/v_new (q and the appended keys are rotated "
                           "at their cache positions, as in flash-attn)");
  constexpr const char* kDoc = "[seqlen_ro, rotary_dim / 2]";
  for (const auto& [name, view] : {std::pair{"kv_cache.rotary_cos", cache.rotary_cos},
                                   std::pair{"kv_cache.rotary_sin", cache.rotary_sin}}) {
    CUFLASH_TRY(check_layout(view, name, 2, kDoc, true));
    CUFLASH_TRY(check_dtype(view, name, p->dtype, "like q"));
    CUFLASH_TRY(check_device(view, name, p->device));
  }
  const TensorView& cos = cache.rotary_cos;
  CUFLASH_TRY(check_dims(cache.rotary_sin, "kv_cache.rotary_sin",
                         {{"seqlen_ro", cos.shape[0]}, {"rotary_dim / 2", cos.shape[1]}}, "like rotary_cos"));
  if (2 * cos.shape[1] > p->head_dim)
    return Status::invalid("kv_cache.rotary_cos: rotary_dim = 2 x " + str(cos.shape[1]) + " = " +
                           str(2 * cos.shape[1]) + " exceeds head_dim " + str(p->head_dim));
  // Every position a row is rotated at: keys below the capacity, and with
  // positional queries the last query past the last appended key.
  const bool positional = p->rotary_positional_queries();
  const std::int64_t rows_needed =
      static_cast<std::int64_t>(p->cache_capacity) + (positional ? std::max(0, p->max_q_len - p->new_len) : 0);
  if (cos.shape[0] < rows_needed)
    return Status::invalid("kv_cache.rotary_cos: expected at least " + str(rows_needed) + " rows (seqlen_ro >= " +
                           (rows_needed > p->cache_capacity ? "the cache's capacity + q_len - new_len, the last "
                                                              "query's position + 1"
                                                            : "the cache's capacity") +
                           "), got shape " + shape_string(cos));
  p->rotary_dim = static_cast<int>(2 * cos.shape[1]);
  p->rotary_interleaved = cache.rotary_interleaved;
  p->rotary_cos = cache.rotary_cos;
  p->rotary_sin = cache.rotary_sin;
  return {};
}

Status resolve_options(const AttentionOptions& options, Problem* p) {
  if (options.softmax_scale && !std::isfinite(*options.softmax_scale))
    return Status::invalid("softmax_scale: expected a finite number, got " + std::to_string(*options.softmax_scale));
  if (options.window_left < -1)
    return Status::invalid("window_left: expected -1 (unbounded) or >= 0, got " + str(options.window_left));
  if (options.window_right < -1)
    return Status::invalid("window_right: expected -1 (unbounded) or >= 0, got " + str(options.window_right));
  if (!std::isfinite(options.softcap) || options.softcap < 0.0f)
    return Status::invalid("softcap: expected 0 (off) or a finite positive number, got " + std::to_string(options.softcap));
  p->softmax_scale = options.softmax_scale ? *options.softmax_scale : 1.0f / std::sqrt(static_cast<float>(p->head_dim));
  p->causal = options.causal;
  p->window_left = options.window_left;
  p->window_right = options.causal ? 0 : options.window_right;
  if (options.diagonal_offset) {
    constexpr std::int64_t kLimit = std::int64_t{1} << 30;
    if (*options.diagonal_offset < -kLimit || *options.diagonal_offset > kLimit)
      return Status::invalid("diagonal_offset: expected |offset| <= 2^30, got " + std::to_string(*options.diagonal_offset));
    if (p->layout == Layout::kv_cache)
      return Status::invalid("diagonal_offset: not with a KV cache (its queries follow its cached keys)");
    if (p->max_q_len > kLimit || p->max_kv_len > kLimit)
      return Status::invalid("diagonal_offset: sequences up to 2^30 rows take it; got max lengths " +
                             std::to_string(p->max_q_len) + " and " + std::to_string(p->max_kv_len));
    p->has_diagonal_offset = true;
    p->diagonal_offset = *options.diagonal_offset;
  }
  p->softcap = options.softcap;
  p->deterministic = options.deterministic;
  if (!(options.dropout_p >= 0.0f && options.dropout_p < 1.0f))
    return Status::invalid("dropout_p: expected 0 (off) <= dropout_p < 1, got " + std::to_string(options.dropout_p));
  p->dropout_p = options.dropout_p;
  p->dropout = {options.dropout_seed, options.dropout_offset, dropout_threshold16(options.dropout_p)};
  return {};
}

// A varlen call with kv_cache.block_table reads its keys from pages and takes
// no other KV-cache field: cu_seqlens_k counts the keys, and nothing is appended.
Status check_paged_varlen_fields(const KvCache& cache, bool forward) {
  if (!forward)
    return Status::invalid("kv_cache.block_table: not in a varlen backward; keys read from pages are forward-only "
                           "(flash-attn's paged varlen call has no backward): give the backward packed k/v");
  if (!cache.seqlens_k.empty())
    return Status::invalid("kv_cache.seqlens_k: not with varlen; the keys of a varlen call with a block table are "
                           "counted by varlen.cu_seqlens_k");
  if (!cache.k_new.empty() || !cache.v_new.empty())
    return Status::invalid(std::string(cache.k_new.empty() ? "kv_cache.v_new" : "kv_cache.k_new") +
                           ": not with varlen; a varlen call with a block table only reads the cache (appends are "
                           "KV-cache calls, with seqlens_k)");
  // Any other KV-cache field (one added later included) would be ignored: refused too.
  KvCache others = cache;
  others.block_table = {};
  if (others.given())
    return Status::invalid("kv_cache: with varlen only kv_cache.block_table may be given");
  return {};
}

// Everything a forward and a backward share: layout, q/k/v, index tensors,
// alibi and options.
Status check_common(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& alibi,
                    const TensorView& sinks, const VarlenBatch& varlen, const KvCache& cache,
                    const AttentionOptions& options, bool forward,
                    void* stream, Problem* p) {
  // flash-attn's paged prefill: packed queries whose keys are in a paged cache,
  // the one way the varlen and kv_cache fields combine.
  const bool paged_varlen = varlen.given() && !cache.block_table.empty();
  if (paged_varlen) CUFLASH_TRY(check_paged_varlen_fields(cache, forward));
  else if (varlen.given() && cache.given())
    return Status::invalid("varlen, kv_cache: a call takes either cu_seqlens (varlen) or a KV cache, not both "
                           "(but for a varlen forward's kv_cache.block_table)");
  p->layout = varlen.given() ? Layout::varlen : cache.given() ? Layout::kv_cache : Layout::dense;
  p->paged = !cache.block_table.empty();
  CUFLASH_TRY(check_qkv(q, k, v, p));
  if (p->layout == Layout::varlen) CUFLASH_TRY(check_varlen(varlen, cache.block_table, options, stream, p));
  if (p->layout == Layout::kv_cache) CUFLASH_TRY(check_kv_cache(cache, options, forward, stream, p));
  CUFLASH_TRY(check_alibi(alibi, p));
  if (!sinks.empty()) {
    CUFLASH_TRY(check_sinks(sinks, "sinks", *p));
    p->has_sinks = true;
    p->sinks = sinks;
  }
  CUFLASH_TRY(resolve_options(options, p));
  return p->layout == Layout::kv_cache ? check_rotary(cache, forward, p) : Status{};
}

std::vector<NamedView> index_views(const Problem& p) {
  return {{"varlen.cu_seqlens_q", p.cu_seqlens_q}, {"varlen.cu_seqlens_k", p.cu_seqlens_k},
          {"kv_cache.seqlens_k", p.seqlens_k},     {"kv_cache.block_table", p.block_table},
          {"kv_cache.leftpad", p.leftpad},         {"kv_cache.rotary_cos", p.rotary_cos},
          {"kv_cache.rotary_sin", p.rotary_sin},   {"alibi_slopes", p.alibi_slopes},
          {"sinks", p.sinks}};
}

}  // namespace

Status validate_forward(const ForwardArgs& args, const AttentionOptions& options, void* stream, Problem* problem) {
  Problem p;
  p.pass = Pass::forward;
  CUFLASH_TRY(check_common(args.q, args.k, args.v, args.alibi_slopes, args.sinks, args.varlen, args.kv_cache, options,
                           true, stream, &p));
  CUFLASH_TRY(check_like(args.out, "out", args.q, "q", q_doc(p)));
  CUFLASH_TRY(check_no_self_overlap(args.out, "out"));
  p.out = args.out;
  if (!args.lse.empty()) {
    CUFLASH_TRY(check_lse(args.lse, "lse", p));
    CUFLASH_TRY(check_no_self_overlap(args.lse, "lse"));
    p.lse = args.lse;
  }
  if (!args.attn_probs.empty()) CUFLASH_TRY(check_attn_probs(args.attn_probs, &p));

  std::vector<NamedView> outputs = {{"out", p.out}, {"lse", p.lse}, {"attn_probs", p.attn_probs}};
  std::vector<NamedView> inputs = index_views(p);
  inputs.push_back({"q", p.q});
  inputs.push_back({"kv_cache.k_new", p.k_new});
  inputs.push_back({"kv_cache.v_new", p.v_new});
  if (p.new_len > 0) {  // the append writes the cache
    CUFLASH_TRY(check_no_self_overlap(p.k, "k"));
    CUFLASH_TRY(check_no_self_overlap(p.v, "v"));
    outputs.push_back({"k", p.k});
    outputs.push_back({"v", p.v});
  } else {
    inputs.push_back({"k", p.k});
    inputs.push_back({"v", p.v});
  }
  CUFLASH_TRY(check_no_aliasing(outputs, inputs));
  *problem = std::move(p);
  return {};
}

Status validate_backward(const BackwardArgs& args, const AttentionOptions& options, void* stream, Problem* problem) {
  Problem p;
  p.pass = Pass::backward;
  CUFLASH_TRY(check_common(args.q, args.k, args.v, args.alibi_slopes, args.sinks, args.varlen, args.kv_cache, options,
                           false, stream, &p));
  CUFLASH_TRY(check_like(args.out, "out", args.q, "q", q_doc(p)));
  CUFLASH_TRY(check_like(args.dout, "dout", args.q, "q", q_doc(p)));
  CUFLASH_TRY(check_given(args.lse, "lse"));
  CUFLASH_TRY(check_lse(args.lse, "lse", p));
  CUFLASH_TRY(check_like(args.dq, "dq", args.q, "q", q_doc(p)));
  CUFLASH_TRY(check_like(args.dk, "dk", args.k, "k", kv_doc(p)));
  CUFLASH_TRY(check_like(args.dv, "dv", args.v, "v", kv_doc(p)));
  for (const auto& [name, view] : {std::pair{"dq", args.dq}, std::pair{"dk", args.dk}, std::pair{"dv", args.dv}})
    CUFLASH_TRY(check_no_self_overlap(view, name));
  if (!args.dsinks.empty()) {
    if (args.sinks.empty())
      return Status::invalid("dsinks: the gradient of sinks, given without sinks (pass the forward's sinks too)");
    CUFLASH_TRY(check_sinks(args.dsinks, "dsinks", p));
    CUFLASH_TRY(check_no_self_overlap(args.dsinks, "dsinks"));
    p.dsinks = args.dsinks;
  }
  p.out = args.out;
  p.dout = args.dout;
  p.lse = args.lse;
  p.dq = args.dq;
  p.dk = args.dk;
  p.dv = args.dv;

  std::vector<NamedView> inputs = index_views(p);
  for (const NamedView& input : std::initializer_list<NamedView>{
           {"q", p.q}, {"k", p.k}, {"v", p.v}, {"out", p.out}, {"dout", p.dout}, {"lse", p.lse}})
    inputs.push_back(input);
  CUFLASH_TRY(check_no_aliasing({{"dq", p.dq}, {"dk", p.dk}, {"dv", p.dv}, {"dsinks", p.dsinks}}, inputs));
  *problem = std::move(p);
  return {};
}

Status validate_merge(const MergeArgs& args, MergeProblem* problem) {
  constexpr const char* kOutDoc = "[batch, seqlen, heads, head_dim]";
  constexpr const char* kLseDoc = "[batch, heads, seqlen]";
  MergeProblem p;
  CUFLASH_TRY(check_given(args.out_a, "out_a"));
  CUFLASH_TRY(check_layout(args.out_a, "out_a", 4, kOutDoc, true));
  if (!is_float(args.out_a.dtype))
    return Status::invalid(std::string("out_a: expected dtype f32, f16 or bf16, got ") + dtype_name(args.out_a.dtype));
  if (args.out_a.device.kind == DeviceKind::cuda && !built_with_cuda())
    return Status::unsupported("out_a: is in CUDA memory, but this build of cuflash has no CUDA support");
  CUFLASH_TRY(check_head_dim(args.out_a, "out_a", kOutDoc));
  // A float32 side a may take a half-precision side b: partial attentions
  // (ring steps, say) accumulated in fp32.
  TensorView b_expected = args.out_a;
  if (args.out_a.dtype == DType::f32 && (args.out_b.dtype == DType::f16 || args.out_b.dtype == DType::bf16))
    b_expected.dtype = args.out_b.dtype;
  CUFLASH_TRY(check_like(args.out_b, "out_b", b_expected, "out_a", kOutDoc));
  CUFLASH_TRY(check_like(args.out, "out", args.out_a, "out_a", kOutDoc));
  const TensorView& a = args.out_a;
  for (const auto& [name, view] : {std::pair{"lse_a", args.lse_a}, std::pair{"lse_b", args.lse_b}, std::pair{"lse", args.lse}}) {
    CUFLASH_TRY(check_given(view, name));
    CUFLASH_TRY(check_layout(view, name, 3, kLseDoc, false));
    CUFLASH_TRY(check_dtype(view, name, DType::f32, "log-sum-exp is always float32"));
    CUFLASH_TRY(check_device(view, name, a.device));
    CUFLASH_TRY(check_dims(view, name, {{"batch", a.shape[0]}, {"heads", a.shape[2]}, {"seqlen", a.shape[1]}}, "from out_a"));
  }
  CUFLASH_TRY(check_no_self_overlap(args.out, "out"));
  CUFLASH_TRY(check_no_self_overlap(args.lse, "lse"));
  // Merging in place into side a is allowed: each row is read whole before it is written.
  std::vector<NamedView> inputs = {{"out_b", args.out_b}, {"lse_b", args.lse_b}};
  if (!same_view(args.out, args.out_a)) inputs.push_back({"out_a", args.out_a});
  if (!same_view(args.lse, args.lse_a)) inputs.push_back({"lse_a", args.lse_a});
  CUFLASH_TRY(check_no_aliasing({{"out", args.out}, {"lse", args.lse}}, inputs));

  p.dtype = a.dtype;
  p.dtype_b = args.out_b.dtype;
  p.device = a.device;
  p.batch = static_cast<int>(a.shape[0]);
  p.seq_len = static_cast<int>(a.shape[1]);
  p.heads = static_cast<int>(a.shape[2]);
  p.head_dim = static_cast<int>(a.shape[3]);
  p.out_a = args.out_a;
  p.lse_a = args.lse_a;
  p.out_b = args.out_b;
  p.lse_b = args.lse_b;
  p.out = args.out;
  p.lse = args.lse;
  *problem = std::move(p);
  return {};
}

}  // namespace cuflash::detail
