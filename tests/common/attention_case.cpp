#include "attention_case.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace cuflash::test {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Sets every element of the rows (all dimensions but the last two, [H, D],
// flattened) for which owned[row] is false to NaN.
void poison_rows(HostTensor& t, const std::vector<bool>& owned) {
  const auto& shape = t.shape();
  const std::int64_t row_elems = shape[shape.size() - 1] * shape[shape.size() - 2];
  for (std::int64_t row = 0; row < static_cast<std::int64_t>(owned.size()); ++row)
    if (!owned[row])
      for (std::int64_t e = 0; e < row_elems; ++e) t.set(row * row_elems + e, kNaN);
}

}  // namespace

const char* dtype_label(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
  }
  return "?";
}

std::string CaseSpec::name() const { return label + "_" + dtype_label(dtype); }

void PrintTo(const CaseSpec& s, std::ostream* os) {
  static const char* layouts[] = {"dense", "varlen", "kv_cache"};
  *os << s.name() << " {" << layouts[static_cast<int>(s.layout)] << " Hq=" << s.heads_q << " Hk=" << s.heads_kv
      << " D=" << s.head_dim;
  if (s.layout == CaseLayout::dense) *os << " B=" << s.batch << " kv_len=" << s.kv_len;
  if (s.layout != CaseLayout::varlen) *os << " q_len=" << s.q_len;
  auto list = [os](const char* name, const std::vector<int>& values) {
    if (values.empty()) return;
    *os << " " << name << "={";
    for (std::size_t i = 0; i < values.size(); ++i) *os << (i ? "," : "") << values[i];
    *os << "}";
  };
  list("q_lens", s.q_lens);
  list("kv_lens", s.kv_lens);
  list("cached", s.cached_lens);
  list("leftpad", s.leftpad);
  if (s.layout == CaseLayout::kv_cache) *os << " new_len=" << s.new_len;
  if (s.layout != CaseLayout::dense) *os << " page_size=" << s.page_size;
  if (s.rotary_dim > 0) *os << " rotary_dim=" << s.rotary_dim << (s.rotary_interleaved ? " interleaved" : " neox");
  if (s.options.softmax_scale) *os << " scale=" << *s.options.softmax_scale;
  *os << " causal=" << s.options.causal
      << " window=(" << s.options.window_left << "," << s.options.window_right << ") softcap=" << s.options.softcap
      << " alibi=" << static_cast<int>(s.alibi) << " sinks=" << s.sinks
      << " dropout=" << s.options.dropout_p << " bhsd=" << s.bhsd << " padding=" << s.row_padding << "}";
}

std::vector<CaseSpec> for_dtypes(const std::vector<CaseSpec>& specs, const std::vector<DType>& dtypes) {
  std::vector<CaseSpec> all;
  for (const CaseSpec& spec : specs)
    for (DType dtype : dtypes) {
      all.push_back(spec);
      all.back().dtype = dtype;
    }
  return all;
}

CaseSpec dense_case(std::string label, int q_len, int kv_len, int heads_q, int heads_kv, int head_dim, int batch) {
  CaseSpec s;
  s.label = std::move(label);
  s.layout = CaseLayout::dense;
  s.batch = batch;
  s.q_len = q_len;
  s.kv_len = kv_len;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  return s;
}

AttentionCase::AttentionCase(CaseSpec spec, std::mt19937& engine) : spec_(std::move(spec)) {
  switch (spec_.layout) {
    case CaseLayout::dense: build_dense(engine); break;
    case CaseLayout::varlen: build_varlen(engine); break;
    case CaseLayout::kv_cache: build_kv_cache(engine); break;
  }
  build_common(engine);
}

int AttentionCase::batch() const {
  switch (spec_.layout) {
    case CaseLayout::dense: return spec_.batch;
    case CaseLayout::varlen: return static_cast<int>(spec_.q_lens.size());
    case CaseLayout::kv_cache: return static_cast<int>(spec_.cached_lens.size());
  }
  return 0;
}

int AttentionCase::q_len(int b) const {
  return spec_.layout == CaseLayout::varlen ? spec_.q_lens[b] : spec_.q_len;
}

int AttentionCase::kv_len(int b) const {
  switch (spec_.layout) {
    case CaseLayout::dense: return spec_.kv_len;
    case CaseLayout::varlen: return spec_.kv_lens[b];
    case CaseLayout::kv_cache: return spec_.cached_lens[b] + spec_.new_len;
  }
  return 0;
}

MemoryLayout AttentionCase::qkv_layout(int rank) const {
  MemoryLayout layout;
  if (spec_.bhsd) layout.memory_order = rank == 4 ? std::vector<int>{0, 2, 1, 3} : std::vector<int>{1, 0, 2};
  layout.row_padding = spec_.row_padding;
  return layout;
}

AttentionOptions AttentionCase::options(Backend backend) const {
  AttentionOptions o = spec_.options;
  o.backend = backend;
  return o;
}

void AttentionCase::build_dense(std::mt19937& engine) {
  const CaseSpec& s = spec_;
  q = HostTensor(s.dtype, {s.batch, s.q_len, s.heads_q, s.head_dim}, qkv_layout(4));
  k = HostTensor(s.dtype, {s.batch, s.kv_len, s.heads_kv, s.head_dim}, qkv_layout(4));
  v = HostTensor(s.dtype, {s.batch, s.kv_len, s.heads_kv, s.head_dim}, qkv_layout(4));
  q.fill_normal(engine, s.input_std);
  k.fill_normal(engine, s.input_std);
  v.fill_normal(engine);
  if (s.with_lse) lse = HostTensor(DType::f32, {s.batch, s.heads_q, s.q_len});
}

void AttentionCase::build_varlen(std::mt19937& engine) {
  const CaseSpec& s = spec_;
  if (s.q_lens.size() != s.kv_lens.size()) throw std::invalid_argument("varlen: q_lens and kv_lens differ in size");
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (std::size_t b = 0; b < s.q_lens.size(); ++b) {
    cu_q.push_back(cu_q.back() + s.q_lens[b]);
    cu_k.push_back(cu_k.back() + s.kv_lens[b]);
  }
  const auto n = static_cast<std::int64_t>(cu_q.size());
  cu_seqlens_q = HostTensor::from_i32(cu_q, {n});
  cu_seqlens_k = HostTensor::from_i32(cu_k, {n});
  const std::int64_t total_q = cu_q.back() + s.extra_rows, total_k = cu_k.back() + s.extra_rows;
  q = HostTensor(s.dtype, {total_q, s.heads_q, s.head_dim}, qkv_layout(3));
  q.fill_normal(engine, s.input_std);
  if (s.poison_unused) poison_rows(q, q_rows_owned_by_row());
  if (s.with_lse) lse = HostTensor(DType::f32, {s.heads_q, total_q});
  if (s.page_size > 0) {
    build_pages(s.kv_lens.empty() ? 0 : *std::max_element(s.kv_lens.begin(), s.kv_lens.end()), engine);
    return;
  }
  k = HostTensor(s.dtype, {total_k, s.heads_kv, s.head_dim}, qkv_layout(3));
  v = HostTensor(s.dtype, {total_k, s.heads_kv, s.head_dim}, qkv_layout(3));
  k.fill_normal(engine, s.input_std);
  v.fill_normal(engine);
  if (s.poison_unused) {
    std::vector<bool> k_owned(total_k, false);
    std::fill(k_owned.begin(), k_owned.begin() + cu_k.back(), true);
    poison_rows(k, k_owned);
    poison_rows(v, k_owned);
  }
}

std::vector<bool> AttentionCase::q_rows_owned_by_row() const {
  const auto& shape = q.shape();
  const std::int64_t rows = q.numel() / (shape[shape.size() - 1] * shape[shape.size() - 2]);
  std::vector<bool> owned(rows, true);
  if (spec_.layout == CaseLayout::varlen) {
    std::int64_t total = 0;
    for (int len : spec_.q_lens) total += len;
    std::fill(owned.begin() + total, owned.end(), false);
  }
  return owned;
}

std::vector<bool> AttentionCase::q_rows_owned() const {
  const std::vector<bool> rows = q_rows_owned_by_row();
  const std::int64_t per_row = q.numel() / static_cast<std::int64_t>(rows.size());
  std::vector<bool> owned(q.numel());
  for (std::int64_t i = 0; i < q.numel(); ++i) owned[i] = rows[i / per_row];
  return owned;
}

int AttentionCase::kv_first(int b) const {
  return spec_.layout == CaseLayout::kv_cache && !spec_.leftpad.empty() ? spec_.leftpad[b] : 0;
}

AttentionCase::CacheRow AttentionCase::cache_row(int b, int j) const {
  if (spec_.page_size == 0) return {b, j};
  return {block_table_values[static_cast<std::size_t>(b) * max_pages + j / spec_.page_size], j % spec_.page_size};
}

AttentionCase AttentionCase::with_packed_keys() const {
  if (spec_.layout != CaseLayout::varlen || spec_.page_size == 0)
    throw std::invalid_argument("with_packed_keys: not a varlen case with pages");
  AttentionCase packed = *this;
  packed.spec_.page_size = 0;
  const std::int64_t total_k = std::accumulate(spec_.kv_lens.begin(), spec_.kv_lens.end(), std::int64_t{0});
  const std::int64_t row = static_cast<std::int64_t>(spec_.heads_kv) * spec_.head_dim;
  packed.k = HostTensor(spec_.dtype, {total_k, spec_.heads_kv, spec_.head_dim}, qkv_layout(3));
  packed.v = HostTensor(spec_.dtype, {total_k, spec_.heads_kv, spec_.head_dim}, qkv_layout(3));
  std::int64_t packed_row = 0;
  for (int b = 0; b < batch(); ++b)
    for (int j = 0; j < spec_.kv_lens[b]; ++j, ++packed_row) {
      const CacheRow r = cache_row(b, j);
      const std::int64_t paged_row = r.outer * spec_.page_size + r.pos;
      for (std::int64_t e = 0; e < row; ++e) {
        packed.k.set(packed_row * row + e, k.get(paged_row * row + e));
        packed.v.set(packed_row * row + e, v.get(paged_row * row + e));
      }
    }
  packed.dk = HostTensor(spec_.dtype, packed.k.shape(), qkv_layout(3));
  packed.dv = HostTensor(spec_.dtype, packed.v.shape(), qkv_layout(3));
  packed.block_table = HostTensor();
  packed.block_table_values.clear();
  packed.max_pages = 0;
  return packed;
}

void AttentionCase::build_kv_cache(std::mt19937& engine) {
  const CaseSpec& s = spec_;
  const int B = batch();
  int longest = 0;
  for (int b = 0; b < B; ++b) longest = std::max(longest, kv_len(b));
  q = HostTensor(s.dtype, {B, s.q_len, s.heads_q, s.head_dim}, qkv_layout(4));
  q.fill_normal(engine, s.input_std);
  if (s.page_size == 0) {
    const std::int64_t capacity = longest + s.capacity_slack;
    k = HostTensor(s.dtype, {B, capacity, s.heads_kv, s.head_dim}, qkv_layout(4));
    v = HostTensor(s.dtype, {B, capacity, s.heads_kv, s.head_dim}, qkv_layout(4));
    k.fill_normal(engine, s.input_std);
    v.fill_normal(engine);
    if (s.poison_unused) poison_unowned_cache_slots();
  } else {
    build_pages(longest, engine);
  }
  seqlens_k = HostTensor::from_i32(std::vector<std::int32_t>(s.cached_lens.begin(), s.cached_lens.end()), {B});
  if (!s.leftpad.empty()) {
    if (static_cast<int>(s.leftpad.size()) != B)
      throw std::invalid_argument("kv_cache: leftpad and cached_lens differ in size");
    leftpad = HostTensor::from_i32(std::vector<std::int32_t>(s.leftpad.begin(), s.leftpad.end()), {B});
  }
  if (s.rotary_dim > 0) build_rotary_tables();
  if (s.new_len > 0) {
    k_new = HostTensor(s.dtype, {B, s.new_len, s.heads_kv, s.head_dim}, qkv_layout(4));
    v_new = HostTensor(s.dtype, {B, s.new_len, s.heads_kv, s.head_dim}, qkv_layout(4));
    k_new.fill_normal(engine, s.input_std);
    v_new.fill_normal(engine);
  }
  if (s.with_lse) lse = HostTensor(DType::f32, {B, s.heads_q, s.q_len});
}

void AttentionCase::build_pages(int longest, std::mt19937& engine) {
  const CaseSpec& s = spec_;
  const int B = batch();
  // Pages are handed out in a shuffled order, so that a backend that
  // assumed block_table[b][p] == b * max_pages + p would read wrong keys.
  max_pages = std::max(1, (longest + s.page_size - 1) / s.page_size);
  const int num_pages = B * max_pages + s.guard_pages;
  std::vector<int> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), engine);
  block_table_values.assign(pages.begin(), pages.begin() + static_cast<std::ptrdiff_t>(B) * max_pages);
  if (s.share_first_page)
    for (int b = 1; b < B; ++b) block_table_values[static_cast<std::size_t>(b) * max_pages] = block_table_values[0];
  block_table = HostTensor::from_i32(std::vector<std::int32_t>(block_table_values.begin(), block_table_values.end()),
                                     {B, max_pages});
  k = HostTensor(s.dtype, {num_pages, s.page_size, s.heads_kv, s.head_dim}, qkv_layout(4));
  v = HostTensor(s.dtype, {num_pages, s.page_size, s.heads_kv, s.head_dim}, qkv_layout(4));
  k.fill_normal(engine, s.input_std);
  v.fill_normal(engine);
  if (s.poison_unused) poison_unowned_cache_slots();
}

int AttentionCase::stored_keys(int b) const {
  return spec_.layout == CaseLayout::varlen ? spec_.kv_lens[b] : spec_.cached_lens[b];
}

// cos/sin [seqlen_ro, rotary_dim / 2] of the usual frequencies
// (angle = position x 10000^(-2k / rotary_dim)), rows for every position a
// query or an appended key can take: the capacity, and q_len past it.
void AttentionCase::build_rotary_tables() {
  const int pairs = spec_.rotary_dim / 2;
  const std::int64_t capacity =
      spec_.page_size == 0 ? k.shape()[1] : static_cast<std::int64_t>(max_pages) * spec_.page_size;
  const std::int64_t rows = capacity + spec_.q_len;
  rotary_cos = HostTensor(spec_.dtype, {rows, pairs});
  rotary_sin = HostTensor(spec_.dtype, {rows, pairs});
  for (std::int64_t position = 0; position < rows; ++position)
    for (int k_pair = 0; k_pair < pairs; ++k_pair) {
      const double angle = static_cast<double>(position) * std::pow(10000.0, -2.0 * k_pair / spec_.rotary_dim);
      rotary_cos.set(position * pairs + k_pair, std::cos(angle));
      rotary_sin.set(position * pairs + k_pair, std::sin(angle));
    }
}

// Cache rows that hold no stored key (append targets, slack, guard pages,
// the tail of a sequence's last page, a leftpad's rows) become NaN: a backend
// must neither read them nor attend to them.
void AttentionCase::poison_unowned_cache_slots() {
  const std::int64_t rows = k.shape()[0] * k.shape()[1];
  std::vector<bool> cached(rows, false);
  for (int b = 0; b < batch(); ++b)
    for (int j = kv_first(b); j < stored_keys(b); ++j) {
      const CacheRow r = cache_row(b, j);
      cached[r.outer * k.shape()[1] + r.pos] = true;
    }
  poison_rows(k, cached);
  poison_rows(v, cached);
}

void AttentionCase::build_common(std::mt19937& engine) {
  const CaseSpec& s = spec_;
  const int B = batch();
  out = HostTensor(s.dtype, q.shape(), qkv_layout(static_cast<int>(q.shape().size())));
  out.poison();
  if (!lse.empty()) lse.poison();
  std::uniform_real_distribution<double> slope(0.05, 1.0);
  if (s.alibi == AlibiKind::per_head) alibi = HostTensor(DType::f32, {s.heads_q});
  if (s.alibi == AlibiKind::per_batch) alibi = HostTensor(DType::f32, {B, s.heads_q});
  for (std::int64_t i = 0; i < alibi.numel(); ++i) alibi.set(i, slope(engine));
  if (s.sinks) {
    // Around the scores' own range, so that the sink takes a real share of each row.
    std::uniform_real_distribution<double> sink(-1.0, 3.0);
    sinks = HostTensor(DType::f32, {s.heads_q});
    for (std::int64_t i = 0; i < sinks.numel(); ++i) sinks.set(i, sink(engine));
    dsinks = HostTensor(DType::f32, {s.heads_q});
    dsinks.poison();
  }
  // Backward tensors: dout random on owned rows, gradients poisoned so that
  // an element the backward fails to write shows as NaN.
  const int rank_q = static_cast<int>(q.shape().size());
  const int rank_k = static_cast<int>(k.shape().size());
  dout = HostTensor(s.dtype, q.shape(), qkv_layout(rank_q));
  dout.fill_normal(engine);
  if (s.poison_unused) poison_rows(dout, q_rows_owned_by_row());
  dq = HostTensor(s.dtype, q.shape(), qkv_layout(rank_q));
  dk = HostTensor(s.dtype, k.shape(), qkv_layout(rank_k));
  dv = HostTensor(s.dtype, v.shape(), qkv_layout(rank_k));
  dq.poison();
  dk.poison();
  dv.poison();
}

namespace {

// The arguments the forward and the backward share: q, k, v, out, lse, alibi
// slopes, and the varlen batch or the KV cache without an append.
template <typename Args>
Args shared_args(const AttentionCase& c) {
  const CaseSpec& s = c.spec();
  Args a;
  a.q = c.q.view();
  a.k = c.k.view();
  a.v = c.v.view();
  a.out = c.out.view();
  a.lse = c.lse.view();
  a.alibi_slopes = c.alibi.view();
  a.sinks = c.sinks.view();
  if (s.layout == CaseLayout::varlen) {
    a.varlen.cu_seqlens_q = c.cu_seqlens_q.view();
    a.varlen.cu_seqlens_k = c.cu_seqlens_k.view();
    a.varlen.max_seqlen_q = *std::max_element(s.q_lens.begin(), s.q_lens.end());
    a.varlen.max_seqlen_k = *std::max_element(s.kv_lens.begin(), s.kv_lens.end());
    a.kv_cache.block_table = c.block_table.view();  // keys in pages (page_size > 0), else empty
  }
  if (s.layout == CaseLayout::kv_cache) {
    a.kv_cache.seqlens_k = c.seqlens_k.view();
    a.kv_cache.block_table = c.block_table.view();
    a.kv_cache.leftpad = c.leftpad.view();
  }
  return a;
}

}  // namespace

ForwardArgs AttentionCase::forward_args() const {
  ForwardArgs a = shared_args<ForwardArgs>(*this);
  if (spec_.layout == CaseLayout::kv_cache) {
    a.kv_cache.k_new = k_new.view();
    a.kv_cache.v_new = v_new.view();
    a.kv_cache.rotary_cos = rotary_cos.view();
    a.kv_cache.rotary_sin = rotary_sin.view();
    a.kv_cache.rotary_interleaved = spec_.rotary_interleaved;
  }
  return a;
}

void AttentionCase::set_forward_outputs(const std::vector<double>& out_values, const std::vector<double>& lse_values) {
  const CaseSpec& s = spec_;
  out.assign(out_values);
  if (lse.empty()) {
    if (s.layout == CaseLayout::varlen)
      lse = HostTensor(DType::f32, {s.heads_q, q.shape()[0]});
    else
      lse = HostTensor(DType::f32, {batch(), s.heads_q, s.q_len});
  }
  lse.assign(lse_values);
}

BackwardArgs AttentionCase::backward_args() const {
  BackwardArgs a = shared_args<BackwardArgs>(*this);
  a.dout = dout.view();
  a.dq = dq.view();
  a.dk = dk.view();
  a.dv = dv.view();
  a.dsinks = dsinks.view();
  return a;
}

}  // namespace cuflash::test
