// Host side of the FlashAttention-2 forward: what it supports, how many
// key splits a small grid gets, parameters, dispatch on dtype x head dim, and
// the kernel that combines split-KV partial results.
#include "sm80/flash_fwd.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/element_io.cuh"
#include "sm80/flash_fwd_tiles.hpp"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_fwd(const ForwardParams& p, cudaStream_t stream);
}  // namespace sm80

namespace {

constexpr int kMaxSplits = 64;

// Split-KV when the grid would leave SMs idle: few (batch x head x query
// block) CTAs over long keys. Each split keeps at least two key tiles.
// Depends on shapes and the device only, so workspace queries agree.
int choose_splits(const Problem& problem) {
  const sm80::FwdTile tile = sm80::fwd_tile(problem.head_dim);
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid || tile.block_m == 0) return 1;
  const long long m_blocks = (problem.max_q_len + tile.block_m - 1) / tile.block_m;
  const long long ctas = m_blocks * problem.heads_q * problem.batch;
  const long long key_tiles = (problem.max_kv_len + tile.block_n - 1) / tile.block_n;
  const long long slots = static_cast<long long>(info.sm_count) * tile.min_blocks;
  if (ctas * 2 > slots || key_tiles < 4) return 1;
  long long splits = (slots + ctas - 1) / ctas;
  splits = std::min<long long>({splits, key_tiles / 2, kMaxSplits});
  return static_cast<int>(std::max<long long>(splits, 1));
}

std::size_t partial_rows(const Problem& problem) {
  return static_cast<std::size_t>(problem.batch) * problem.heads_q * problem.max_q_len;
}

constexpr std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

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

template <typename T>
Status launch_for_dim(const ForwardParams& p, int head_dim, cudaStream_t stream) {
  return sm80::with_head_dim(
      head_dim, [&](auto d) { return sm80::launch_flash_fwd<T, decltype(d)::value>(p, stream); },
      [&] { return Status::unsupported("backend cuda: head_dim " + std::to_string(head_dim) + " has no kernel"); });
}

template <typename T>
Status run_forward(ForwardParams& p, int head_dim, cudaStream_t stream) {
  CUFLASH_TRY(launch_for_dim<T>(p, head_dim, stream));
  if (p.num_splits == 1) return {};
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
  constexpr int kThreads = 256;
  const std::int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
  combine_splits_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  return launch_status("combine_splits_kernel");
}

}  // namespace

Status flash_forward_supports(const Problem& problem) {
  CUFLASH_TRY(sm80_attention_supports(problem, "forward"));
  if (!problem.out.empty()) CUFLASH_TRY(check_kernel_view(problem.out, "out"));
  return {};
}

std::size_t flash_forward_workspace_bytes(const Problem& problem) {
  const int splits = choose_splits(problem);
  if (splits == 1) return 0;
  const std::size_t rows = partial_rows(problem) * splits;
  return align256(rows * problem.head_dim * sizeof(float)) + align256(rows * sizeof(float));
}

Status flash_forward(const Problem& problem, void* workspace, cudaStream_t stream) {
  ForwardParams p = make_forward_params(problem);
  p.num_splits = choose_splits(problem);
  if (p.num_splits > 1) {
    const std::size_t rows = partial_rows(problem) * p.num_splits;
    auto* base = static_cast<unsigned char*>(workspace);
    p.out_partial = reinterpret_cast<float*>(base);
    p.lse_partial = reinterpret_cast<float*>(base + align256(rows * problem.head_dim * sizeof(float)));
  }
  if (problem.dtype == DType::bf16) return run_forward<__nv_bfloat16>(p, problem.head_dim, stream);
  return run_forward<__half>(p, problem.head_dim, stream);
}

}  // namespace cuflash::detail
