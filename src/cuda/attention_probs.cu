#include "common/attention_probs.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/dropout.cuh"
#include "common/element_io.cuh"
#include "common/score_mask.cuh"

namespace cuflash::detail {
namespace {

constexpr int kThreads = 128;

struct ProbsParams {
  float* probs;
  std::int64_t stride_b, stride_h, stride_i, stride_j;
  int probs_kv_len;
  const float* lse;
};

// Block (i, h, b): query row i's probabilities over every key column.
template <typename T>
__global__ void attention_probs_kernel(AttentionParams p, ProbsParams out) {
  extern __shared__ float query[];
  const int i = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const SeqBounds seq = seq_bounds(p, b);
  float* row = out.probs + b * out.stride_b + h * out.stride_h + static_cast<std::int64_t>(i) * out.stride_i;
  if (i >= seq.q_len) {  // rows of no query (varlen): zeros
    for (int j = threadIdx.x; j < out.probs_kv_len; j += kThreads) row[j * out.stride_j] = 0.0f;
    return;
  }
  const T* q = static_cast<const T*>(p.q) + row_offset(p.q_strides, b, seq.q_start, i, h);
  for (int d = threadIdx.x; d < p.head_dim; d += kThreads) query[d] = load_float(q + d);
  __syncthreads();
  const ScoreRules rules = score_rules(p, seq, b, h);
  const float lse_log2 = out.lse[lse_offset(p, b, seq.q_start, i, h)] * kLog2e;
  const int hk = h / p.group;
  for (int j = threadIdx.x; j < out.probs_kv_len; j += kThreads) {
    float prob = 0.0f;
    if (j < seq.k_len && rules.visible(i, j) && lse_log2 != -INFINITY) {
      const T* k = static_cast<const T*>(p.k) + row_offset(p.k_strides, b, seq.k_start, j, hk);
      float dot = 0.0f;
      for (int d = 0; d < p.head_dim; ++d) dot += query[d] * load_float(k + d);
      const float logit2 = rules.transformed ? rules.logit2(dot, i, j) : dot * rules.scale_log2;
      prob = exp2f(logit2 - lse_log2);
    }
    // flash-attn's S_dmask: a dropped entry negated (-0 for a zero one, so
    // the sign still carries the mask), over the sequence's keys.
    if (p.has_dropout && j < seq.k_len && !dropout_keeps(p.dropout, b, h, p.heads_q, i, j)) prob = -prob;
    row[j * out.stride_j] = prob;
  }
}

}  // namespace

Status write_attention_probs(const Problem& problem, const TensorView& lse, cudaStream_t stream) {
  if (problem.attn_probs.empty() || problem.batch == 0 || problem.heads_q == 0 || problem.max_q_len == 0) return {};
  Problem with_lse = problem;
  with_lse.lse = lse;
  const AttentionParams params = make_attention_params(with_lse);
  const TensorView& probs = problem.attn_probs;
  const ProbsParams out{static_cast<float*>(probs.data), probs.strides[0], probs.strides[1], probs.strides[2],
                        probs.strides[3], problem.probs_kv_len, static_cast<const float*>(lse.data)};
  const dim3 grid(static_cast<unsigned>(problem.max_q_len), static_cast<unsigned>(problem.heads_q),
                  static_cast<unsigned>(problem.batch));
  const std::size_t shared = static_cast<std::size_t>(problem.head_dim) * sizeof(float);
  switch (problem.dtype) {
    case DType::f32: attention_probs_kernel<float><<<grid, kThreads, shared, stream>>>(params, out); break;
    case DType::f16: attention_probs_kernel<__half><<<grid, kThreads, shared, stream>>>(params, out); break;
    case DType::bf16: attention_probs_kernel<__nv_bfloat16><<<grid, kThreads, shared, stream>>>(params, out); break;
    case DType::i32: return {StatusCode::internal, "attn_probs: int32 inputs"};
  }
  return launch_status("attention_probs_kernel");
}

}  // namespace cuflash::detail
