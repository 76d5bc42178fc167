#include "sm80/combine_splits.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/tensor_core.cuh"

namespace cuflash::detail {

namespace {

constexpr int kMaxCombineSplits = 64;  // two per lane

// One warp per (split-merged) row. The lanes hold the splits' lse (split s
// in lane s % 32, slot s / 32), so the row's lse is two warp reductions and
// each split's weight exp(lse_s - lse) is computed once; then every lane
// owns four consecutive dims (a float4 of each partial) and sums over the
// splits, whose loads are independent and unrolled so that many are in
// flight. (The first version looped over the splits serially per dim and
// recomputed the weights: 32 us for B=1, 32 heads, 32 splits on an H100.)
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
  const int splits = p.num_splits;
  float lse_s[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int s = lane + 32 * k;
    lse_s[k] = s < splits ? p.lse_partial[s * rows + warp_global] : -INFINITY;
  }
  float max_lse = fmaxf(lse_s[0], lse_s[1]);
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  float weight[2] = {0.0f, 0.0f};
  float total = 0.0f;
  if (max_lse != -INFINITY) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      weight[k] = expf(lse_s[k] - max_lse);  // 0 for splits that saw no key (and for lanes past the splits)
      total += weight[k];
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  const float lse = max_lse == -INFINITY ? -INFINITY : max_lse + logf(total);
  const float inv_total = max_lse == -INFINITY ? 0.0f : 1.0f / total;
  weight[0] *= inv_total;
  weight[1] *= inv_total;

  T* out = static_cast<T*>(p.out) + static_cast<std::int64_t>(b) * p.out_strides.batch +
           static_cast<std::int64_t>(q_start + i) * p.out_strides.row + static_cast<std::int64_t>(h) * p.out_strides.head;
  const float* partial = p.out_partial + warp_global * p.head_dim;
  const std::int64_t split_stride = rows * p.head_dim;
  // Whole warp in every iteration (the shuffles need all lanes); lanes past
  // head_dim read and write nothing.
  for (int d0 = 0; d0 < p.head_dim; d0 += 4 * 32) {
    const int d = d0 + 4 * lane;
    const bool active = d < p.head_dim;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    constexpr int kUnroll = 8;
    for (int s0 = 0; s0 < splits; s0 += kUnroll) {
      float4 x[kUnroll];
      float w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int s = s0 + u;
        w[u] = __shfl_sync(0xffffffffu, s < 32 ? weight[0] : weight[1], s % 32);
        x[u] = active && s < splits ? *reinterpret_cast<const float4*>(partial + s * split_stride + d)
                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc.x += w[u] * x[u].x;
        acc.y += w[u] * x[u].y;
        acc.z += w[u] * x[u].z;
        acc.w += w[u] * x[u].w;
      }
    }
    if (active) *reinterpret_cast<uint2*>(out + d) = make_uint2(sm80::pack2<T>(acc.x, acc.y), sm80::pack2<T>(acc.z, acc.w));
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
  if (p.num_splits > kMaxCombineSplits)
    return Status(StatusCode::internal, "combine_splits: " + std::to_string(p.num_splits) + " splits, at most " +
                            std::to_string(kMaxCombineSplits));
  constexpr int kThreads = 256;
  const std::int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  combine_splits_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return launch_status("combine_splits_kernel");
}

template Status launch_combine_splits<__half>(const ForwardParams&, cudaStream_t);
template Status launch_combine_splits<__nv_bfloat16>(const ForwardParams&, cudaStream_t);

}  // namespace cuflash::detail
