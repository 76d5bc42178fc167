// The float64 oracle: attention computed the obvious way, one query row at a
// time, every score materialized, in double. Nothing here is tiled, fused or
// shared with a backend, so that a bug in a backend cannot hide in the oracle.
// Semantics: docs/semantics.md.
#include "float64_oracle.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "half_convert.hpp"
#include "philox.hpp"
#include "problem.hpp"
#include "tensor_access.hpp"
#include "validate.hpp"

namespace cuflash::oracle {
namespace {

using detail::cpu::load_element_f64;

using detail::Layout;
using detail::Problem;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Rows of q/k/v/out/dout are addressed as (outer, pos, head): [outer, pos, head, :]
// in a rank-4 view, [pos, head, :] in a rank-3 (varlen) view where outer is 0.
std::int64_t memory_offset(const TensorView& t, std::int64_t outer, std::int64_t pos, std::int64_t head) {
  if (t.rank == 3) return pos * t.strides[0] + head * t.strides[1];
  return outer * t.strides[0] + pos * t.strides[1] + head * t.strides[2];
}

// Index of element 0 of that row in the view's logical row-major order.
std::int64_t logical_offset(const TensorView& t, std::int64_t outer, std::int64_t pos, std::int64_t head) {
  if (t.rank == 3) return (pos * t.shape[1] + head) * t.shape[2];
  return ((outer * t.shape[1] + pos) * t.shape[2] + head) * t.shape[3];
}

std::int64_t logical_numel(const TensorView& t) {
  std::int64_t n = 1;
  for (int d = 0; d < t.rank; ++d) n *= t.shape[d];
  return n;
}

std::vector<double> load_row(const TensorView& t, std::int64_t outer, std::int64_t pos, std::int64_t head,
                             int head_dim) {
  std::vector<double> row(head_dim);
  const std::int64_t base = memory_offset(t, outer, pos, head);
  for (int d = 0; d < head_dim; ++d) row[d] = load_element_f64(t, base + d * t.strides[t.rank - 1]);
  return row;
}

// `value` as a tensor of `dtype` holds it (through float: the call rotates in fp32).
double round_to_dtype(double value, DType dtype) {
  const float single = static_cast<float>(value);
  switch (dtype) {
    case DType::f16: return detail::f16_to_float(detail::float_to_f16(single));
    case DType::bf16: return detail::bf16_to_float(detail::float_to_bf16(single));
    case DType::f32:
    case DType::i32: break;
  }
  return single;
}

// The rotary embedding (docs/semantics.md): the first rotary_dim columns of
// `row` rotated by the angles of row `position` of cos/sin, exactly, then
// rounded to the dtype the call stores the rotated q and keys in.
// GPT-NeoX: column c pairs with c +- rotary_dim / 2, angle column c mod
// rotary_dim / 2; GPT-J (interleaved): with c xor 1, angle column c / 2.
void rotate(const Problem& p, int position, std::vector<double>& row) {
  const int half = p.rotary_dim / 2;
  const std::vector<double> x = row;
  for (int c = 0; c < p.rotary_dim; ++c) {
    const bool first = p.rotary_interleaved ? c % 2 == 0 : c < half;
    const int partner = p.rotary_interleaved ? c ^ 1 : (first ? c + half : c - half);
    const int angle = p.rotary_interleaved ? c / 2 : c % half;
    const TensorView& cos_view = p.rotary_cos;
    const TensorView& sin_view = p.rotary_sin;
    const double cos = load_element_f64(cos_view, position * cos_view.strides[0] + angle * cos_view.strides[1]);
    const double sin = load_element_f64(sin_view, position * sin_view.strides[0] + angle * sin_view.strides[1]);
    row[c] = round_to_dtype(first ? x[c] * cos - x[partner] * sin : x[c] * cos + x[partner] * sin, p.dtype);
  }
}

// Rotary positions: appended key n at cached + n; query i at cached + i in a
// causal or windowed call, else at cached.
int rotary_query_row(const Problem& p, int b, int i) {
  const bool positional = p.window_left >= 0 || p.window_right >= 0;
  return p.host_seqlens_k[b] + (positional ? i : 0);
}

// Where key j of sequence b lives: which tensor, and the (outer, pos) of its row.
struct KeyLocation {
  bool from_new = false;  // k_new/v_new rather than k/v
  std::int64_t outer = 0;
  std::int64_t pos = 0;
};

// Cache position j of sequence b in a paged cache: (page, slot).
KeyLocation locate_in_pages(const Problem& p, int b, int j) {
  const int page = p.host_block_table[static_cast<std::size_t>(b) * p.max_pages + j / p.page_size];
  return {false, page, j % p.page_size};
}

KeyLocation locate_key(const Problem& p, int b, int j) {
  switch (p.layout) {
    case Layout::dense: return {false, b, j};
    case Layout::varlen:
      if (p.paged) return locate_in_pages(p, b, j);  // keys counted by cu_seqlens_k, stored in pages
      return {false, 0, p.host_cu_seqlens_k[b] + j};
    case Layout::kv_cache: {
      const int cached = p.host_seqlens_k[b];
      // The append is virtual: new keys are read from k_new, the cache is untouched.
      if (j >= cached) return {true, b, j - cached};
      if (!p.paged) return {false, b, j};
      return locate_in_pages(p, b, j);
    }
  }
  return {};
}

std::int64_t query_pos(const Problem& p, int b, int i) {
  return p.layout == Layout::varlen ? p.host_cu_seqlens_q[b] + i : i;
}
std::int64_t query_outer(const Problem& p, int b) { return p.layout == Layout::varlen ? 0 : b; }

// Index of lse for (b, h, i) in the [B, Hq, q_len] / varlen [Hq, total_q] result.
std::int64_t lse_index(const Problem& p, int b, int h, int i) {
  if (p.layout == Layout::varlen) return static_cast<std::int64_t>(h) * p.q.shape[0] + query_pos(p, b, i);
  return (static_cast<std::int64_t>(b) * p.heads_q + h) * p.max_q_len + i;
}

std::int64_t lse_numel(const Problem& p) {
  if (p.layout == Layout::varlen) return static_cast<std::int64_t>(p.heads_q) * p.q.shape[0];
  return static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
}

double alibi_slope(const Problem& p, int b, int h) {
  const TensorView& a = p.alibi_slopes;
  if (p.alibi_per_batch) return load_element_f64(a, b * a.strides[0] + h * a.strides[1]);
  return load_element_f64(a, h * a.strides[0]);
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t d = 0; d < a.size(); ++d) sum += a[d] * b[d];
  return sum;
}

// The q, k, v (and for backward dout) rows of one (sequence, query head) pair.
struct HeadRows {
  std::vector<std::vector<double>> q, k, v, dout;
};

HeadRows load_head(const Problem& p, int b, int h, bool with_dout) {
  HeadRows rows;
  const int hk = h / p.group_size();
  for (int i = 0; i < p.q_len(b); ++i) {
    rows.q.push_back(load_row(p.q, query_outer(p, b), query_pos(p, b, i), h, p.head_dim));
    if (p.rotary_dim > 0) rotate(p, rotary_query_row(p, b, i), rows.q.back());
    if (with_dout) rows.dout.push_back(load_row(p.dout, query_outer(p, b), query_pos(p, b, i), h, p.head_dim));
  }
  for (int j = 0; j < p.kv_len(b); ++j) {
    const KeyLocation loc = locate_key(p, b, j);
    rows.k.push_back(load_row(loc.from_new ? p.k_new : p.k, loc.outer, loc.pos, hk, p.head_dim));
    if (loc.from_new && p.rotary_dim > 0) rotate(p, j, rows.k.back());  // key j is cache row j
    rows.v.push_back(load_row(loc.from_new ? p.v_new : p.v, loc.outer, loc.pos, hk, p.head_dim));
  }
  return rows;
}

// A KV cache's leftpad: cache rows before it are no key of sequence b.
int first_key(const Problem& p, int b) { return p.has_leftpad ? p.host_leftpad[b] : 0; }

bool visible(const Problem& p, int b, int i, int j, std::int64_t offset) {
  const bool right_ok = p.window_right < 0 || j <= i + offset + p.window_right;
  const bool left_ok = p.window_left < 0 || j >= i + offset - p.window_left;
  return right_ok && left_ok && j >= first_key(p, b);
}

// Softmax of one query row over all keys of its sequence (and the sink).
struct RowSoftmax {
  std::vector<double> raw;   // softmax_scale * dot(q, k), before softcap
  std::vector<double> prob;  // 0 where not visible
  std::vector<double> keep;  // dropout's factor: 1 / (1 - p) where kept, 0 where dropped (1 without dropout)
  std::vector<char> seen;    // visible
  double lse = kNegInf;      // -inf when no key is visible and there is no sink
  double sink_prob = 0.0;    // exp(sink - lse)
};

double sink_of(const Problem& p, int h) {
  if (!p.has_sinks) return kNegInf;
  return load_element_f64(p.sinks, h * p.sinks.strides[0]);
}

RowSoftmax row_softmax(const Problem& p, const HeadRows& rows, int b, int h, int i) {
  const int kv_len = static_cast<int>(rows.k.size());
  const std::int64_t offset =
      p.has_diagonal_offset ? p.diagonal_offset : static_cast<std::int64_t>(kv_len) - static_cast<int>(rows.q.size());
  RowSoftmax r;
  r.raw.assign(kv_len, 0.0);
  r.prob.assign(kv_len, 0.0);
  r.seen.assign(kv_len, 0);
  r.keep.assign(kv_len, 1.0);
  if (p.has_dropout())
    for (int j = 0; j < kv_len; ++j)
      r.keep[j] = detail::dropout_keeps(p.dropout, b, h, p.heads_q, i, j) ? 1.0 / (1.0 - p.dropout_p) : 0.0;
  std::vector<double> score(kv_len, kNegInf);
  const double sink = sink_of(p, h);
  double max_score = sink;
  for (int j = 0; j < kv_len; ++j) {
    if (!visible(p, b, i, j, offset)) continue;
    r.seen[j] = 1;
    r.raw[j] = static_cast<double>(p.softmax_scale) * dot(rows.q[i], rows.k[j]);
    double s = r.raw[j];
    if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
    if (p.has_alibi) s -= alibi_slope(p, b, h) * std::abs(static_cast<double>(i + offset - j));
    score[j] = s;
    if (s > max_score) max_score = s;
  }
  if (max_score == kNegInf) return r;  // no visible key, no sink
  double sum = sink == kNegInf ? 0.0 : std::exp(sink - max_score);
  for (int j = 0; j < kv_len; ++j)
    if (r.seen[j]) sum += std::exp(score[j] - max_score);
  r.lse = max_score + std::log(sum);
  for (int j = 0; j < kv_len; ++j)
    if (r.seen[j]) r.prob[j] = std::exp(score[j] - r.lse);
  if (sink != kNegInf) r.sink_prob = std::exp(sink - r.lse);
  return r;
}

std::vector<double> weighted_sum(const std::vector<double>& weights, const std::vector<std::vector<double>>& rows,
                                 int head_dim) {
  std::vector<double> out(head_dim, 0.0);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    if (weights[j] == 0.0) continue;
    for (int d = 0; d < head_dim; ++d) out[d] += weights[j] * rows[j][d];
  }
  return out;
}

// P with dropout applied: the weights of out = sum_j weight_j v_j.
std::vector<double> dropped(const RowSoftmax& r) {
  std::vector<double> weights(r.prob.size());
  for (std::size_t j = 0; j < weights.size(); ++j) weights[j] = r.prob[j] * r.keep[j];
  return weights;
}

Status require_host(const Problem& p) {
  if (p.device.kind != DeviceKind::host) return Status::unsupported("float64 oracle: tensors must be in host memory");
  if (p.layout != Layout::dense && !p.host_indices_valid) return Status::unsupported("float64 oracle: index tensors are not readable on the host");
  return Status::success();
}

}  // namespace

Status forward_float64(const ForwardArgs& args, const AttentionOptions& options, ForwardResult* result) {
  Problem p;
  CUFLASH_TRY(detail::validate_forward(args, options, nullptr, &p));
  CUFLASH_TRY(require_host(p));
  // Packed varlen rows that belong to no sequence keep NaN: "no value defined".
  result->out.assign(logical_numel(p.out), kNaN);
  result->lse.assign(lse_numel(p), kNaN);
  const bool with_probs = !p.attn_probs.empty();
  if (with_probs) result->attn_probs.assign(logical_numel(p.attn_probs), 0.0);
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads_q; ++h) {
      const HeadRows rows = load_head(p, b, h, false);
      for (int i = 0; i < p.q_len(b); ++i) {
        const RowSoftmax r = row_softmax(p, rows, b, h, i);
        const std::vector<double> o = weighted_sum(dropped(r), rows.v, p.head_dim);  // all 0 if nothing visible
        if (with_probs) {
          const std::int64_t row = ((static_cast<std::int64_t>(b) * p.heads_q + h) * p.max_q_len + i) * p.probs_kv_len;
          for (std::size_t j = 0; j < r.prob.size(); ++j)
            result->attn_probs[row + j] = r.keep[j] == 0.0 ? -r.prob[j] : r.prob[j];
        }
        const std::int64_t base = logical_offset(p.out, query_outer(p, b), query_pos(p, b, i), h);
        for (int d = 0; d < p.head_dim; ++d) result->out[base + d] = o[d];
        result->lse[lse_index(p, b, h, i)] = r.lse;
      }
    }
  }
  if (p.rotary_dim > 0) {
    // k_new as the append writes it: row n of sequence b rotated at cache row seqlens_k[b] + n.
    result->k_appended.assign(logical_numel(p.k_new), kNaN);
    for (int b = 0; b < p.batch; ++b)
      for (int n = 0; n < p.new_len; ++n)
        for (int hk = 0; hk < p.heads_kv; ++hk) {
          std::vector<double> row = load_row(p.k_new, b, n, hk, p.head_dim);
          rotate(p, p.host_seqlens_k[b] + n, row);
          const std::int64_t base = logical_offset(p.k_new, b, n, hk);
          for (int d = 0; d < p.head_dim; ++d) result->k_appended[base + d] = row[d];
        }
  }
  return Status::success();
}

Status backward_float64(const BackwardArgs& args, const AttentionOptions& options, BackwardResult* result) {
  Problem p;
  CUFLASH_TRY(detail::validate_backward(args, options, nullptr, &p));
  CUFLASH_TRY(require_host(p));
  // Every element is defined: positions no query reached have gradient 0.
  result->dq.assign(logical_numel(p.q), 0.0);
  result->dq_terms.assign(logical_numel(p.q), 0.0);
  result->dk.assign(logical_numel(p.k), 0.0);
  result->dv.assign(logical_numel(p.v), 0.0);
  if (p.has_sinks) result->dsinks.assign(p.heads_q, 0.0);
  const double scale = p.softmax_scale;
  for (int b = 0; b < p.batch; ++b) {
    for (int h = 0; h < p.heads_q; ++h) {
      const int hk = h / p.group_size();
      const HeadRows rows = load_head(p, b, h, true);
      const int kv_len = static_cast<int>(rows.k.size());
      std::vector<std::vector<double>> dk(kv_len, std::vector<double>(p.head_dim, 0.0));
      std::vector<std::vector<double>> dv(kv_len, std::vector<double>(p.head_dim, 0.0));
      for (int i = 0; i < p.q_len(b); ++i) {
        const RowSoftmax r = row_softmax(p, rows, b, h, i);
        const std::vector<double> out = weighted_sum(dropped(r), rows.v, p.head_dim);
        const double d_i = dot(rows.dout[i], out);
        // The sink: one more softmax entry whose value is 0, so its dP is 0.
        if (p.has_sinks) result->dsinks[h] += r.sink_prob * (0.0 - d_i);
        std::vector<double> dq(p.head_dim, 0.0), dq_terms(p.head_dim, 0.0);
        for (int j = 0; j < kv_len; ++j) {
          if (!r.seen[j]) continue;
          // out = sum_j P_j keep_j v_j: dP_j = keep_j dot(dout, v_j); dv_j = P_j keep_j dout.
          const double dp = r.keep[j] * dot(rows.dout[i], rows.v[j]);
          double ds = r.prob[j] * (dp - d_i);
          if (p.softcap > 0.0f) {
            const double t = std::tanh(r.raw[j] / p.softcap);
            ds *= 1.0 - t * t;
          }
          for (int d = 0; d < p.head_dim; ++d) {
            dq[d] += scale * ds * rows.k[j][d];
            dq_terms[d] += std::abs(scale * ds * rows.k[j][d]);
            dk[j][d] += scale * ds * rows.q[i][d];
            dv[j][d] += r.prob[j] * r.keep[j] * rows.dout[i][d];
          }
        }
        const std::int64_t base = logical_offset(p.dq, query_outer(p, b), query_pos(p, b, i), h);
        for (int d = 0; d < p.head_dim; ++d) {
          result->dq[base + d] = dq[d];
          result->dq_terms[base + d] = dq_terms[d];
        }
      }
      // Accumulate: kv heads are shared by a group of query heads, and cache
      // pages may be shared by several sequences.
      for (int j = 0; j < kv_len; ++j) {
        const KeyLocation loc = locate_key(p, b, j);
        const std::int64_t base = logical_offset(p.dk, loc.outer, loc.pos, hk);
        for (int d = 0; d < p.head_dim; ++d) {
          result->dk[base + d] += dk[j][d];
          result->dv[base + d] += dv[j][d];
        }
      }
    }
  }
  return Status::success();
}

}  // namespace cuflash::oracle
