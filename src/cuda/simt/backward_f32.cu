// Float32 backward of backend=cuda on the CUDA cores, deterministic and
// without atomics: every gradient row is owned by one warp that sums its
// contributions in a fixed order.
//   1. dq kernel, one warp per (query row, q head): D_i = dot(dout_i, out_i)
//      (kept in the workspace for kernel 2), then over the visible keys
//      dq_i = scale * sum_j dS_ij k_j.
//   2. dk/dv kernel, one warp per (key row, kv head): over the group's query
//      heads and the rows that see the key, dv_j = sum_i P_ij dout_i and
//      dk_j = scale * sum_i dS_ij q_i.
// P_ij = exp(s_ij - lse_i) with the forward's lse; dS_ij = P_ij (Z_ij dP_ij - D_i),
// times 1 - tanh^2(raw/softcap) with softcap, and dv takes Z_ij P_ij, where Z
// is dropout's mask / (1 - p) (1 without dropout; docs/semantics.md).
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/dropout.cuh"
#include "simt/attention_f32.hpp"
#include "simt/warp_rows.cuh"

namespace cuflash::detail {

namespace {

using namespace simt;

// Row of D_i in the [Hq, q rows] workspace: dense b*max_q_len + i, varlen the packed row.
__device__ __forceinline__ std::int64_t dsum_offset(const BackwardParams& p, const SeqBounds& s, int b, int i, int h) {
  const std::int64_t row = p.cu_seqlens_q != nullptr ? static_cast<std::int64_t>(s.q_start) + i
                                                     : static_cast<std::int64_t>(b) * p.max_q_len + i;
  return h * p.total_q_rows + row;
}

// dS_ij from the raw dot products q.k and dout.v of one (row, key); *prob:
// the dropped probability Z_ij P_ij that dv takes.
__device__ __forceinline__ float grad_score(const RowScore& score, float qk, float dp, float lse, float dsum,
                                           float dropout_z, int i, int j, float* prob) {
  float squashed;
  const float s = score.logit(qk, i, j, &squashed);
  const float p_ij = expf(s - lse);
  *prob = p_ij * dropout_z;
  const float ds = p_ij * (dp * dropout_z - dsum);
  return score.softcap > 0.0f ? ds * (1.0f - squashed * squashed) : ds;
}

template <int N>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock) backward_dq_f32_kernel(BackwardParams p) {
  WarpTask task;
  if (!warp_task(p.max_q_len, p.heads_q, p.batch, &task)) return;
  const int i = task.row, h = task.head, b = task.batch, hk = h / p.group;
  const SeqBounds s = seq_bounds(p, b);
  if (i >= s.q_len) return;
  const RowScore score = row_score(p, s, b, h);
  const auto* k = static_cast<const float*>(p.k);
  const auto* v = static_cast<const float*>(p.v);

  RowFrag<N> qf, dof, of, dq;
  qf.load(row_ptr(static_cast<const float*>(p.q), p.q_strides, b, s.q_start, i, h), p.head_dim);
  dof.load(row_ptr(static_cast<const float*>(p.dout), p.dout_strides, b, s.q_start, i, h), p.head_dim);
  of.load(row_ptr(static_cast<const float*>(p.out), p.out_strides, b, s.q_start, i, h), p.head_dim);
  const float dsum = warp_sum(partial_dot(dof, of));
  if (threadIdx.x == 0) p.dsum[dsum_offset(p, s, b, i, h)] = dsum;
  const float lse = p.lse[lse_offset(p, b, s.q_start, i, h)];

  dq.zero();
  int lo, hi;
  score.keys_of_row(i, &lo, &hi);
  for (int j = lo; j < hi; ++j) {
    RowFrag<N> kf, vf;
    kf.load(row_ptr(k, p.k_strides, b, s.k_start, j, hk), p.head_dim);
    vf.load(row_ptr(v, p.v_strides, b, s.k_start, j, hk), p.head_dim);
    float qk = partial_dot(qf, kf), dp = partial_dot(dof, vf);
    warp_sum2(&qk, &dp);
    float prob;
    dq.add(grad_score(score, qk, dp, lse, dsum, dropout_factor(p, b, h, i, j), i, j, &prob), kf);
  }
  dq.store(row_ptr(static_cast<float*>(p.dq), p.dq_strides, b, s.q_start, i, h), p.head_dim, p.softmax_scale);
}

template <int N>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock) backward_dkdv_f32_kernel(BackwardParams p) {
  WarpTask task;
  if (!warp_task(p.max_kv_len, p.heads_kv, p.batch, &task)) return;
  const int j = task.row, hk = task.head, b = task.batch;
  const SeqBounds s = seq_bounds(p, b);
  if (j >= s.k_len) return;
  const auto* q = static_cast<const float*>(p.q);
  const auto* dout = static_cast<const float*>(p.dout);

  RowFrag<N> kf, vf, dk, dv;
  kf.load(row_ptr(static_cast<const float*>(p.k), p.k_strides, b, s.k_start, j, hk), p.head_dim);
  vf.load(row_ptr(static_cast<const float*>(p.v), p.v_strides, b, s.k_start, j, hk), p.head_dim);
  dk.zero();
  dv.zero();
  for (int h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const RowScore score = row_score(p, s, b, h);
    int lo, hi;
    score.rows_of_key(j, &lo, &hi);
    for (int i = lo; i < hi; ++i) {
      RowFrag<N> qf, dof;
      qf.load(row_ptr(q, p.q_strides, b, s.q_start, i, h), p.head_dim);
      dof.load(row_ptr(dout, p.dout_strides, b, s.q_start, i, h), p.head_dim);
      const float lse = p.lse[lse_offset(p, b, s.q_start, i, h)];
      const float dsum = p.dsum[dsum_offset(p, s, b, i, h)];
      float qk = partial_dot(qf, kf), dp = partial_dot(dof, vf);
      warp_sum2(&qk, &dp);
      float prob;
      const float ds = grad_score(score, qk, dp, lse, dsum, dropout_factor(p, b, h, i, j), i, j, &prob);
      dv.add(prob, dof);
      dk.add(ds, qf);
    }
  }
  dk.store(row_ptr(static_cast<float*>(p.dk), p.dk_strides, b, s.k_start, j, hk), p.head_dim, p.softmax_scale);
  dv.store(row_ptr(static_cast<float*>(p.dv), p.dv_strides, b, s.k_start, j, hk), p.head_dim, 1.0f);
}

}  // namespace

std::size_t f32_backward_workspace_bytes(const Problem& problem) {
  return static_cast<std::size_t>(total_q_rows(problem)) * problem.heads_q * sizeof(float);
}

Status f32_backward(const Problem& problem, void* workspace, cudaStream_t stream) {
  CUFLASH_TRY(f32_attention_supports(problem));
  BackwardParams p = make_backward_params(problem);
  p.deterministic = true;
  p.dsum = static_cast<float*>(workspace);

  const dim3 block(kWarp, kWarpsPerBlock);
  const dim3 dq_grid = simt::warp_grid(p.batch, p.heads_q, p.max_q_len);
  const dim3 dkdv_grid = simt::warp_grid(p.batch, p.heads_kv, p.max_kv_len);
  return simt::with_frag_size(p.head_dim, [&](auto n) -> Status {
    constexpr int N = decltype(n)::value;
    // dk/dv read D_i, so the dq kernel (which writes it) goes first.
    if (dq_grid.x > 0) {
      backward_dq_f32_kernel<N><<<dq_grid, block, 0, stream>>>(p);
      CUFLASH_TRY(launch_status("backward_dq_f32_kernel"));
    }
    if (dkdv_grid.x > 0) {
      backward_dkdv_f32_kernel<N><<<dkdv_grid, block, 0, stream>>>(p);
      CUFLASH_TRY(launch_status("backward_dkdv_f32_kernel"));
    }
    return {};
  });
}

}  // namespace cuflash::detail
