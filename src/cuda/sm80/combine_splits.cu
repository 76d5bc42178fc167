#include "sm80/combine_splits.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/element_io.cuh"

namespace cuflash::detail {

namespace {

// One warp per (split-merged) row: lse = log-sum-exp over the splits, out =
// sum of exp(lse_s - lse) * out_s. Splits that saw no key have lse -inf.
template <typename T>
__global__ void combine_splits_kernel(const ForwardParams p) {
  const int warp_global = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
  if (warp_global >= rows) return;
  const int i = static_cast<int>(warp_global % p.max_q_len);
  const int h = static_cast<int>((warp_global / p.max_q_len) % p.heads_q);
  const int b = static_cast<int>(warp_global / (static_cast<std::int64_t>(p.max_q_len) * p.heads_q));
  int q_start = 0, q_len = p.max_q_len;
  if (p.cu_seqlens_q != nullptr) {
    q_start = p.cu_seqlens_q[b];
    q_len = p.cu_seqlens_q[b + 1] - q_start;
  }
  if (i >= q_len) return;
  float max_lse = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) max_lse = fmaxf(max_lse, p.lse_partial[s * rows + warp_global]);
  float total = 0.0f;
  if (max_lse != -INFINITY)
    for (int s = 0; s < p.num_splits; ++s) total += expf(p.lse_partial[s * rows + warp_global] - max_lse);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(total);
  T* out = static_cast<T*>(p.out) + static_cast<std::int64_t>(b) * p.out_strides.batch +
           static_cast<std::int64_t>(q_start + i) * p.out_strides.row + static_cast<std::int64_t>(h) * p.out_strides.head;
  for (int d = lane; d < p.head_dim; d += 32) {
    float acc = 0.0f;
    if (max_lse != -INFINITY)
      for (int s = 0; s < p.num_splits; ++s) {
        const float w = expf(p.lse_partial[s * rows + warp_global] - lse);
        acc += w * p.out_partial[(s * rows + warp_global) * p.head_dim + d];
      }
    store_float(out + d, acc);
  }
  if (lane == 0 && p.lse != nullptr) {
    p.lse[static_cast<std::int64_t>(b) * p.lse_batch_stride + static_cast<std::int64_t>(h) * p.lse_head_stride +
          static_cast<std::int64_t>(q_start + i) * p.lse_row_stride] = lse;
  }
}

}  // namespace

template <typename T>
Status launch_combine_splits(const ForwardParams& p, cudaStream_t stream) {
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
  if (rows == 0) return {};
  constexpr int kThreads = 256;
  const std::int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  combine_splits_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return launch_status("combine_splits_kernel");
}

template Status launch_combine_splits<__half>(const ForwardParams&, cudaStream_t);
template Status launch_combine_splits<__nv_bfloat16>(const ForwardParams&, cudaStream_t);

}  // namespace cuflash::detail
