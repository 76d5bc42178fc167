// Float32 forward of backend=cuda on the CUDA cores (plain fp32 FMAs, no
// TF32): one warp per (query row, head, batch) runs an online softmax over
// the row's visible keys. Exact to float32 rounding, not fast.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "common/cuda_check.hpp"
#include "common/dropout.cuh"
#include "simt/attention_f32.hpp"
#include "simt/warp_rows.cuh"

namespace cuflash::detail {

namespace {

using namespace simt;

template <int N>
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock) forward_f32_kernel(ForwardParams p) {
  WarpTask task;
  if (!warp_task(p.max_q_len, p.heads_q, p.batch, &task)) return;
  const int i = task.row, h = task.head, b = task.batch, hk = h / p.group;
  const SeqBounds s = seq_bounds(p, b);
  if (i >= s.q_len) return;
  const RowScore score = row_score(p, s, b, h);
  const auto* q = static_cast<const float*>(p.q);
  const auto* k = static_cast<const float*>(p.k);
  const auto* v = static_cast<const float*>(p.v);

  RowFrag<N> qf, acc;
  qf.load(row_ptr(q, p.q_strides, b, s.q_start, i, h), p.head_dim);
  acc.zero();
  float m = -INFINITY, l = 0.0f;  // running max and sum of exp(s - m)
  int lo, hi;
  score.keys_of_row(i, &lo, &hi);
  for (int j = lo; j < hi; ++j) {
    RowFrag<N> kf, vf;
    kf.load(row_ptr(k, p.k_strides, b, s.k_start, j, hk), p.head_dim);
    vf.load(row_ptr(v, p.v_strides, b, s.k_start, j, hk), p.head_dim);
    float squashed;
    const float sj = score.logit(warp_sum(partial_dot(qf, kf)), i, j, &squashed);
    const float m_new = fmaxf(m, sj);
    const float correction = expf(m - m_new);  // 0 on the first key (m = -inf)
    const float pj = expf(sj - m_new);
    l = fmaf(l, correction, pj);  // the sum of every key: dropout acts on normalized probabilities
    acc.scale_add(correction, pj * dropout_factor(p, b, h, i, j), vf);
    m = m_new;
  }

  // No visible key: l == 0, out = 0 and lse = -inf.
  const bool empty = l == 0.0f;
  auto* out = static_cast<float*>(p.out);
  RowFrag<N> result;
#pragma unroll
  for (int t = 0; t < N; ++t) result.x[t] = empty ? 0.0f : acc.x[t] / l;
  result.store(row_ptr(out, p.out_strides, b, s.q_start, i, h), p.head_dim, 1.0f);
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[lse_offset(p, b, s.q_start, i, h)] = empty ? -INFINITY : m + logf(l);
}

}  // namespace

Status f32_attention_supports(const Problem& problem) {
  if (problem.dtype != DType::f32)
    return Status::unsupported(std::string("backend cuda: the float32 (SIMT) path got ") + dtype_name(problem.dtype));
  if (problem.layout == Layout::kv_cache)
    return Status::unsupported("backend cuda: KV caches run on the f16/bf16 kernels only (f32: backend cpu)");
  if (problem.head_dim > kMaxHeadDim)
    return Status::unsupported("backend cuda: float32 attention supports head_dim <= " + std::to_string(kMaxHeadDim) +
                               ", got " + std::to_string(problem.head_dim));
  // One warp per row of q (and, backward, of k): the grid's x extent caps them.
  const std::int64_t max_rows = static_cast<std::int64_t>(std::numeric_limits<int>::max()) * kWarpsPerBlock;
  const std::int64_t rows = std::max(static_cast<std::int64_t>(problem.batch) * problem.heads_q * problem.max_q_len,
                                     static_cast<std::int64_t>(problem.batch) * problem.heads_kv * problem.max_kv_len);
  if (rows > max_rows)
    return Status::unsupported("backend cuda: float32 attention supports batch * heads * seqlen <= " +
                               std::to_string(max_rows) + ", got " + std::to_string(rows));
  return {};
}

std::size_t f32_forward_workspace_bytes(const Problem&) { return 0; }

Status f32_forward(const Problem& problem, void*, cudaStream_t stream) {
  CUFLASH_TRY(f32_attention_supports(problem));
  ForwardParams p = make_forward_params(problem);

  const dim3 grid = simt::warp_grid(p.batch, p.heads_q, p.max_q_len);
  if (grid.x == 0) return {};
  const dim3 block(kWarp, kWarpsPerBlock);
  return simt::with_frag_size(p.head_dim, [&](auto n) {
    forward_f32_kernel<decltype(n)::value><<<grid, block, 0, stream>>>(p);
    return launch_status("forward_f32_kernel");
  });
}

}  // namespace cuflash::detail
