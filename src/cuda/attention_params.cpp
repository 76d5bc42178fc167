// Problem -> AttentionParams: strides of the caller's views, varlen offsets,
// resolved score options.
#include "common/attention_params.hpp"

#include <cmath>

#include "problem.hpp"

namespace cuflash::detail {

RowStrides row_strides(const TensorView& view, Layout layout) {
  if (view.empty()) return {};
  if (layout == Layout::varlen) return {0, view.strides[0], view.strides[1]};
  return {view.strides[0], view.strides[1], view.strides[2]};
}

namespace {

int log2_exact(int value) {
  int shift = 0;
  while ((1 << shift) < value) ++shift;
  return shift;
}

}  // namespace

KvCacheParams make_kv_cache_params(const Problem& problem) {
  KvCacheParams c;
  c.seqlens_k = static_cast<const std::int32_t*>(problem.seqlens_k.data);
  if (problem.paged) {
    c.block_table = static_cast<const std::int32_t*>(problem.block_table.data);
    c.block_table_stride = problem.block_table.strides[0];
    // flash_decode_supports and paged_varlen_supports took the size
    // (cuda_page_size_supported): a power of two gets its shift.
    c.page_size = problem.page_size;
    c.page_shift = is_power_of_two(problem.page_size) ? log2_exact(problem.page_size) : -1;
    c.num_pages = problem.num_pages;
  }
  if (problem.has_leftpad) c.leftpad = static_cast<const std::int32_t*>(problem.leftpad.data);
  c.capacity = problem.cache_capacity;
  c.new_len = problem.new_len;
  if (problem.rotary_dim > 0) {
    c.rotary.cos = problem.rotary_cos.data;
    c.rotary.sin = problem.rotary_sin.data;
    c.rotary.cos_row_stride = problem.rotary_cos.strides[0];
    c.rotary.sin_row_stride = problem.rotary_sin.strides[0];
    c.rotary.dim = problem.rotary_dim;
    c.rotary.interleaved = problem.rotary_interleaved;
    c.rotary.positional = problem.rotary_positional_queries();
  }
  if (problem.new_len > 0) {
    c.k_new = problem.k_new.data;
    c.v_new = problem.v_new.data;
    c.k_new_strides = row_strides(problem.k_new, Layout::kv_cache);
    c.v_new_strides = row_strides(problem.v_new, Layout::kv_cache);
  }
  return c;
}

AttentionParams make_attention_params(const Problem& problem) {
  AttentionParams p;
  p.q = problem.q.data;
  p.k = problem.k.data;
  p.v = problem.v.data;
  p.q_strides = row_strides(problem.q, problem.layout);
  p.k_strides = row_strides(problem.k, problem.layout);
  p.v_strides = row_strides(problem.v, problem.layout);
  if (problem.layout == Layout::varlen) {
    p.cu_seqlens_q = static_cast<const std::int32_t*>(problem.cu_seqlens_q.data);
    p.cu_seqlens_k = static_cast<const std::int32_t*>(problem.cu_seqlens_k.data);
  }
  p.batch = problem.batch;
  p.heads_q = problem.heads_q;
  p.heads_kv = problem.heads_kv;
  p.group = problem.group_size();
  p.head_dim = problem.head_dim;
  p.max_q_len = problem.max_q_len;
  p.max_kv_len = problem.max_kv_len;
  p.softmax_scale = problem.softmax_scale;
  p.softmax_scale_log2 = problem.softmax_scale * 1.4426950408889634f;
  p.softcap = problem.softcap;
  p.window_left = problem.window_left;
  p.window_right = problem.window_right;
  p.has_diagonal_offset = problem.has_diagonal_offset;
  p.diagonal_offset = static_cast<int>(problem.diagonal_offset);  // |offset| <= 2^30 (validate)
  if (problem.has_alibi) {
    p.alibi_slopes = static_cast<const float*>(problem.alibi_slopes.data);
    if (problem.alibi_per_batch) {
      p.alibi_batch_stride = problem.alibi_slopes.strides[0];
      p.alibi_head_stride = problem.alibi_slopes.strides[1];
    } else {
      p.alibi_batch_stride = 0;
      p.alibi_head_stride = problem.alibi_slopes.strides[0];
    }
  }
  if (problem.has_dropout()) {
    p.has_dropout = true;
    p.dropout = problem.dropout;
    p.dropout_keep_scale = problem.dropout_keep_scale();
  }
  if (problem.layout == Layout::kv_cache) p.cache = make_kv_cache_params(problem);
  if (!problem.lse.empty()) {
    p.lse = static_cast<float*>(problem.lse.data);
    if (problem.layout == Layout::varlen) {
      p.lse_batch_stride = 0;
      p.lse_head_stride = problem.lse.strides[0];
      p.lse_row_stride = problem.lse.strides[1];
    } else {
      p.lse_batch_stride = problem.lse.strides[0];
      p.lse_head_stride = problem.lse.strides[1];
      p.lse_row_stride = problem.lse.strides[2];
    }
  }
  return p;
}

ForwardParams make_forward_params(const Problem& problem) {
  ForwardParams p;
  static_cast<AttentionParams&>(p) = make_attention_params(problem);
  p.out = problem.out.data;
  p.out_strides = row_strides(problem.out, problem.layout);
  return p;
}

BackwardParams make_backward_params(const Problem& problem) {
  BackwardParams p;
  static_cast<AttentionParams&>(p) = make_attention_params(problem);
  p.out = problem.out.data;
  p.dout = problem.dout.data;
  p.dq = problem.dq.data;
  p.dk = problem.dk.data;
  p.dv = problem.dv.data;
  p.out_strides = row_strides(problem.out, problem.layout);
  p.dout_strides = row_strides(problem.dout, problem.layout);
  p.dq_strides = row_strides(problem.dq, problem.layout);
  p.dk_strides = row_strides(problem.dk, problem.layout);
  p.dv_strides = row_strides(problem.dv, problem.layout);
  p.deterministic = problem.deterministic;
  p.total_q_rows = total_q_rows(problem);
  return p;
}

std::int64_t total_q_rows(const Problem& problem) {
  if (problem.layout == Layout::varlen) return problem.q.shape[0];
  return static_cast<std::int64_t>(problem.batch) * problem.max_q_len;
}

}  // namespace cuflash::detail
