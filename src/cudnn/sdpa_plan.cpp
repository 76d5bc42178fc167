#include "sdpa_plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace cuflash::detail::cudnn {

namespace {

constexpr std::size_t kScratchAlignment = 256;

// A [B, H, S, D] view of `view` (dense [B, S, H, D], or varlen [T, H, D] with
// `seq` the bucketed max length). Dims of extent 1 get the packed BSHD stride:
// their stride is never used, and a canonical value keeps it out of the key
// and out of cuDNN's alignment checks.
TensorDesc describe_view(const TensorView& view, std::int64_t batch, std::int64_t seq, bool ragged, Side side) {
  TensorDesc t;
  t.used = true;
  const std::int64_t heads = ragged ? view.shape[1] : view.shape[2];
  const std::int64_t dim = ragged ? view.shape[2] : view.shape[3];
  t.dim[0] = batch;
  t.dim[1] = heads;
  t.dim[2] = seq;
  t.dim[3] = dim;
  if (ragged) {
    t.ragged = true;
    t.side = side;
    t.token_stride = view.strides[0];
    t.stride[1] = view.strides[1];
    t.stride[2] = view.strides[0];
    // Unused (each sequence starts at its ragged offset); a padded batch's stride.
    t.stride[0] = seq * view.strides[0];
  } else {
    t.stride[0] = view.strides[0];
    t.stride[1] = view.strides[2];
    t.stride[2] = view.strides[1];
  }
  t.stride[3] = 1;
  const std::int64_t packed[4] = {seq * heads * dim, dim, heads * dim, 1};
  for (int d = 0; d < 3; ++d)
    if (t.dim[d] == 1) t.stride[d] = packed[d];
  if (ragged && t.dim[2] == 1) t.token_stride = packed[2];
  return t;
}

// A KV cache as cuDNN's container: [B | num_pages, Hk, capacity | page_size, D].
TensorDesc describe_cache(const TensorView& view) {
  TensorDesc t;
  t.used = true;
  t.dim[0] = view.shape[0];
  t.dim[1] = view.shape[2];
  t.dim[2] = view.shape[1];
  t.dim[3] = view.shape[3];
  t.stride[0] = view.strides[0];
  t.stride[1] = view.strides[2];
  t.stride[2] = view.strides[1];
  t.stride[3] = 1;
  const std::int64_t packed[4] = {t.dim[2] * t.dim[1] * t.dim[3], t.dim[3], t.dim[1] * t.dim[3], 1};
  for (int d = 0; d < 3; ++d)
    if (t.dim[d] == 1) t.stride[d] = packed[d];
  return t;
}

TensorDesc packed_stats(std::int64_t batch, std::int64_t heads, std::int64_t seq) {
  TensorDesc t;
  t.used = true;
  t.dim[0] = batch;
  t.dim[1] = heads;
  t.dim[2] = seq;
  t.dim[3] = 1;
  t.stride[0] = heads * seq;
  t.stride[1] = seq;
  t.stride[2] = 1;
  t.stride[3] = 1;
  return t;
}

// Token-major [total_q, Hq] stats, ragged by cu_seqlens_q: the layout cuDNN
// documents for packed (THD) stats.
TensorDesc ragged_stats(std::int64_t batch, std::int64_t heads, std::int64_t seq) {
  TensorDesc t = packed_stats(batch, heads, seq);
  t.stride[1] = 1;
  t.stride[2] = heads;
  t.ragged = true;
  t.side = Side::q;
  t.token_stride = heads;
  return t;
}

// Whether some query row sees no key: for sequence lengths (q, kv) that is
// every row when kv == 0, else the rows before the bottom-right band starts.
bool row_can_be_empty(int q_len, int kv_len, int window_right) {
  if (q_len == 0) return false;
  return kv_len == 0 || (window_right >= 0 && q_len - kv_len - window_right > 0);
}

// Whether some key is seen by no query: every key when q == 0, else the keys
// left of the first row's window.
bool key_can_be_unseen(int q_len, int kv_len, int window_left) {
  if (kv_len == 0) return false;
  return q_len == 0 || (window_left >= 0 && kv_len - q_len - window_left > 0);
}

template <typename Predicate>
bool any_sequence(const Problem& p, Predicate predicate) {
  if (p.layout == Layout::dense) return predicate(p.max_q_len, p.max_kv_len);
  if (!p.host_indices_valid) return true;  // lengths live on the device only: assume the worst
  for (int b = 0; b < p.batch; ++b)
    if (predicate(p.q_len(b), p.kv_len(b))) return true;
  return false;
}

void place_scratch(SdpaPlan& plan, std::int64_t stats_floats) {
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t offset = at;
    at += (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    return offset;
  };
  const auto batch = static_cast<std::size_t>(plan.batch);
  if (plan.q_lengths == LengthSource::constant || plan.q_lengths == LengthSource::from_cu_seqlens)
    plan.scratch.q_lengths = take(batch * sizeof(std::int32_t));
  if (plan.kv_lengths == LengthSource::constant || plan.kv_lengths == LengthSource::from_cu_seqlens)
    plan.scratch.kv_lengths = take(batch * sizeof(std::int32_t));
  for (int s = 0; s < kSlots; ++s)
    if (plan.tensors[s].used && plan.tensors[s].ragged) plan.scratch.offsets[s] = take((batch + 1) * sizeof(std::int64_t));
  if (plan.stats == StatsPlace::scratch_dense || plan.stats == StatsPlace::scratch_ragged)
    plan.scratch.stats = take(static_cast<std::size_t>(stats_floats) * sizeof(float));
  plan.scratch.bytes = at;
}

}  // namespace

const char* slot_name(Slot slot) {
  static const char* names[kSlots] = {"q", "k", "v", "out", "stats", "dout", "dq", "dk", "dv"};
  return names[slot_index(slot)];
}

SdpaNode sdpa_node_from_environment() {
  static const SdpaNode node = [] {
    const char* value = std::getenv("CUFLASH_CUDNN_SDPA");
    const std::string text = value != nullptr ? value : "";
    if (text == "unified") return SdpaNode::unified;
    if (text == "auto") return SdpaNode::automatic;
    return SdpaNode::composite;
  }();
  return node;
}

bool SdpaPlan::any_ragged() const {
  for (const TensorDesc& t : tensors)
    if (t.used && t.ragged) return true;
  return false;
}

std::int64_t varlen_length_bucket(int max_len) {
  std::int64_t bucket = 64;
  while (bucket < max_len) bucket *= 2;
  return bucket;
}

SdpaPlan make_plan(const Problem& p) {
  SdpaPlan plan;
  plan.pass = p.pass;
  plan.layout = p.layout;
  plan.dtype = p.dtype;
  plan.device = p.device.index;
  plan.batch = p.batch;
  plan.heads_q = p.heads_q;
  plan.heads_kv = p.heads_kv;
  plan.head_dim = p.head_dim;
  plan.deterministic = p.pass == Pass::backward && p.deterministic;
  plan.node = sdpa_node_from_environment();

  const bool varlen = p.layout == Layout::varlen;
  const bool cache = p.layout == Layout::kv_cache;
  const std::int64_t batch = p.batch;
  std::int64_t seq_q = p.max_q_len, seq_kv = p.max_kv_len;
  if (varlen) {
    seq_q = varlen_length_bucket(p.max_q_len);
    seq_kv = varlen_length_bucket(p.max_kv_len);
  } else if (cache) {
    seq_kv = p.cache_capacity;
  }

  plan.tensor(Slot::q) = describe_view(p.q, batch, seq_q, varlen, Side::q);
  if (cache) {
    plan.tensor(Slot::k) = describe_cache(p.k);
    plan.tensor(Slot::v) = describe_cache(p.v);
  } else {
    plan.tensor(Slot::k) = describe_view(p.k, batch, seq_kv, varlen, Side::kv);
    plan.tensor(Slot::v) = describe_view(p.v, batch, seq_kv, varlen, Side::kv);
  }
  plan.tensor(Slot::o) = describe_view(p.out, batch, seq_q, varlen, Side::q);
  if (p.pass == Pass::backward) {
    plan.tensor(Slot::dout) = describe_view(p.dout, batch, seq_q, varlen, Side::q);
    plan.tensor(Slot::dq) = describe_view(p.dq, batch, seq_q, varlen, Side::q);
    plan.tensor(Slot::dk) = describe_view(p.dk, batch, seq_kv, varlen, Side::kv);
    plan.tensor(Slot::dv) = describe_view(p.dv, batch, seq_kv, varlen, Side::kv);
  }

  if (cache && p.paged) {
    plan.paged = true;
    plan.page_table_cols = p.max_pages;
    plan.page_table_row_stride = p.block_table.strides[0];
    if (p.batch == 1) plan.page_table_row_stride = p.max_pages;  // unused; canonical
    plan.max_seq_len_kv = p.cache_capacity;
  }

  // The mask. Equal lengths: top-left and bottom-right are the same band, and
  // top-left is what PyTorch's cuDNN path uses.
  const bool band = p.window_left >= 0 || p.window_right >= 0;
  plan.left_bound = p.window_left >= 0 ? p.window_left + 1 : -1;
  plan.right_bound = p.window_right;
  if (varlen) {
    plan.padding_mask = true;
    plan.q_lengths = LengthSource::from_cu_seqlens;
    plan.kv_lengths = LengthSource::from_cu_seqlens;
    plan.bottom_right = band;
  } else if (cache) {
    plan.padding_mask = true;
    plan.q_lengths = LengthSource::constant;
    plan.q_len_constant = p.max_q_len;
    plan.kv_lengths = LengthSource::caller_seqlens_k;
    plan.bottom_right = band;
  } else {
    plan.bottom_right = band && seq_q != seq_kv;
    // cuDNN aligns a bottom-right band with more queries than keys only on
    // per-sequence lengths: give it constant ones.
    if (plan.bottom_right && seq_q > seq_kv) {
      plan.padding_mask = true;
      plan.q_lengths = LengthSource::constant;
      plan.kv_lengths = LengthSource::constant;
      plan.q_len_constant = p.max_q_len;
      plan.kv_len_constant = p.max_kv_len;
    }
  }

  plan.fix_empty_rows =
      any_sequence(p, [&](int q_len, int kv_len) { return row_can_be_empty(q_len, kv_len, p.window_right); });
  if (p.pass == Pass::backward)
    plan.fix_unseen_keys =
        any_sequence(p, [&](int q_len, int kv_len) { return key_can_be_unseen(q_len, kv_len, p.window_left); });

  // The stats. cuDNN before 9.26 reads a non-ragged backward Stats only as
  // packed [B, H, S], and its -inf for an empty row would give exp(-inf + inf)
  // = NaN: the backward gets a packed copy with +inf there (P = 0) when needed.
  std::int64_t stats_floats = 0;
  // cuDNN assumes 16-byte aligned tensors: an lse elsewhere goes through scratch.
  const bool lse_packed = !p.lse.empty() && p.lse.is_contiguous() &&
                          reinterpret_cast<std::uintptr_t>(p.lse.data) % 16 == 0;
  if (p.pass == Pass::forward) {
    plan.generate_stats = !p.lse.empty();
    if (plan.generate_stats)
      plan.stats = varlen ? StatsPlace::scratch_ragged : lse_packed ? StatsPlace::caller : StatsPlace::scratch_dense;
  } else {
    plan.stats = varlen                                 ? StatsPlace::scratch_ragged
                 : lse_packed && !plan.fix_empty_rows ? StatsPlace::caller
                                                        : StatsPlace::scratch_dense;
  }
  if (plan.stats == StatsPlace::scratch_ragged) {
    plan.tensor(Slot::stats) = ragged_stats(batch, p.heads_q, seq_q);
    // Rows up to the bucketed length past the last packed row, in case cuDNN
    // touches a sequence's padded rows.
    stats_floats = (p.q.shape[0] + seq_q) * p.heads_q;
  } else if (plan.stats != StatsPlace::none) {
    plan.tensor(Slot::stats) = packed_stats(batch, p.heads_q, seq_q);
    stats_floats = batch * p.heads_q * seq_q;
  }

  place_scratch(plan, stats_floats);
  return plan;
}

std::vector<std::int64_t> graph_key(const SdpaPlan& plan) {
  std::vector<std::int64_t> key = {
      1,  // layout of this key
      static_cast<std::int64_t>(plan.pass), static_cast<std::int64_t>(plan.layout), static_cast<std::int64_t>(plan.dtype),
      plan.device, plan.batch, plan.heads_q, plan.heads_kv, plan.head_dim};
  for (const TensorDesc& t : plan.tensors) {
    key.push_back(t.used);
    if (!t.used) continue;
    key.insert(key.end(), std::begin(t.dim), std::end(t.dim));
    key.insert(key.end(), std::begin(t.stride), std::end(t.stride));
    key.push_back(t.ragged);
    key.push_back(static_cast<std::int64_t>(t.side));
    key.push_back(t.token_stride);
  }
  key.insert(key.end(), {plan.padding_mask, static_cast<std::int64_t>(plan.q_lengths),
                         static_cast<std::int64_t>(plan.kv_lengths), plan.bottom_right, plan.left_bound,
                         plan.right_bound, plan.generate_stats, static_cast<std::int64_t>(plan.stats),
                         plan.deterministic, plan.paged, plan.page_table_cols, plan.page_table_row_stride,
                         plan.max_seq_len_kv, static_cast<std::int64_t>(plan.node)});
  return key;
}

std::string describe(const SdpaPlan& plan) {
  const TensorDesc& q = plan.tensor(Slot::q);
  const TensorDesc& k = plan.tensor(Slot::k);
  std::string text = std::string(plan.pass == Pass::forward ? "forward " : "backward ") + layout_name(plan.layout) +
                     (plan.paged ? " paged " : " ") + dtype_name(plan.dtype) + " B=" + std::to_string(plan.batch) +
                     " Hq=" + std::to_string(plan.heads_q) + " Hk=" + std::to_string(plan.heads_kv) +
                     " D=" + std::to_string(plan.head_dim) + " S=" + std::to_string(q.dim[2]) + "x" +
                     std::to_string(plan.paged ? plan.max_seq_len_kv : k.dim[2]);
  if (plan.left_bound >= 0 || plan.right_bound >= 0)
    text += " band(" + std::to_string(plan.left_bound) + "," + std::to_string(plan.right_bound) +
            (plan.bottom_right ? ",bottom-right)" : ",top-left)");
  if (plan.padding_mask) text += " padding";
  if (plan.generate_stats || plan.pass == Pass::backward) text += " stats";
  if (plan.deterministic) text += " deterministic";
  return text;
}

}  // namespace cuflash::detail::cudnn
