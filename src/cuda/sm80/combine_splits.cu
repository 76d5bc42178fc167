#include "sm80/combine_splits.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/dependent_launch.cuh"
#include "common/scratch.hpp"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "problem.hpp"
#include "sm80/flash_decode_tiles.hpp"
#include "softmax_merge.hpp"

namespace cuflash::detail {

namespace {

constexpr int kMaxCombineSplits = sm80::kDecodeMaxSplits;
constexpr int kSplitsPerLane = kMaxCombineSplits / 32;  // of the first warp
static_assert(kMaxCombineSplits % 32 == 0, "whole lanes of splits");
constexpr int kMaxCombineDim = 256;
constexpr int kCombineWarps = 4;

// Where merged row `row` (of batch * heads_q * max_q_len) goes: query i of
// head h in batch b, whose sequence starts at packed row q_start (varlen)
// and has q_len queries; i >= q_len is no row at all.
struct CombineRow {
  int i, h, b, q_start, q_len;
};

__device__ __forceinline__ CombineRow combine_row(const ForwardParams& p, std::int64_t row) {
  CombineRow r;
  r.i = static_cast<int>(row % p.max_q_len);
  r.h = static_cast<int>((row / p.max_q_len) % p.heads_q);
  r.b = static_cast<int>(row / (static_cast<std::int64_t>(p.max_q_len) * p.heads_q));
  r.q_start = 0;
  r.q_len = p.max_q_len;
  if (p.cu_seqlens_q != nullptr) {
    r.q_start = p.cu_seqlens_q[r.b];
    r.q_len = p.cu_seqlens_q[r.b + 1] - r.q_start;
  }
  return r;
}

// One CTA per merged row, so that a row's partials are read in one round
// trip to memory rather than one per few splits: the first warp turns the
// splits' lse (split s in lane s % 32, slot s / 32) into the row's lse and
// each split's weight exp(lse_s - lse); then warp w sums the splits w, w + 4,
// ... over its float4 columns of the partials, eight loads in flight per
// lane, and the warps' sums meet in shared memory. (A warp per row looping
// over the splits took 18 us for B=1, 32 heads, 32 splits, D=128 on an
// H100 under ncu; serially per dim, 32 us.)
template <typename T>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_splits_kernel(const ForwardParams p) {
  __shared__ float s_weight[kMaxCombineSplits];
  __shared__ float4 s_sum[kCombineWarps][kMaxCombineDim / 4];
  wait_for_producer_grid();
  const std::int64_t row = blockIdx.x;
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
  const auto [i, h, b, q_start, q_len] = combine_row(p, row);
  if (i >= q_len) return;  // the whole CTA: no row of the batch
  const int splits = p.num_splits;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (warp == 0) {
    float lse_s[kSplitsPerLane];
    float max_lse = -INFINITY;
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k) {
      const int s = lane + 32 * k;
      lse_s[k] = s < splits ? p.lse_partial[s * rows + row] : -INFINITY;
      max_lse = fmaxf(max_lse, lse_s[k]);
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
    float weight[kSplitsPerLane] = {};
    float total = 0.0f;
    if (max_lse != -INFINITY) {
#pragma unroll
      for (int k = 0; k < kSplitsPerLane; ++k) {
        weight[k] = lse_weight(lse_s[k], max_lse);  // 0 for splits that saw no key, and past the splits
        total += weight[k];
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
    const float inv_total = max_lse == -INFINITY ? 0.0f : 1.0f / total;
#pragma unroll
    for (int k = 0; k < kSplitsPerLane; ++k) s_weight[lane + 32 * k] = weight[k] * inv_total;
    if (lane == 0 && p.lse != nullptr) {
      p.lse[lse_offset(p, b, q_start, i, h)] = merged_lse(max_lse, total);
    }
  }
  __syncthreads();

  const int quads = p.head_dim / 4;
  const float* partial = p.out_partial + row * p.head_dim;
  const std::int64_t split_stride = rows * p.head_dim;
  for (int q = lane; q < quads; q += 32) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    constexpr int kInFlight = 8;
    for (int s0 = warp; s0 < splits; s0 += kInFlight * kCombineWarps) {
      float4 x[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int s = s0 + u * kCombineWarps;
        x[u] = s < splits ? reinterpret_cast<const float4*>(partial + s * split_stride)[q]
                          : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int s = s0 + u * kCombineWarps;
        const float w = s < splits ? s_weight[s] : 0.0f;
        acc.x += w * x[u].x;
        acc.y += w * x[u].y;
        acc.z += w * x[u].z;
        acc.w += w * x[u].w;
      }
    }
    s_sum[warp][q] = acc;
  }
  __syncthreads();

  T* out = static_cast<T*>(p.out) + row_offset(p.out_strides, b, q_start, i, h);
  for (int q = threadIdx.x; q < quads; q += kCombineWarps * 32) {
    float4 acc = s_sum[0][q];
#pragma unroll
    for (int w = 1; w < kCombineWarps; ++w) {
      const float4 x = s_sum[w][q];
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    reinterpret_cast<uint2*>(out)[q] = make_uint2(sm80::pack2<T>(acc.x, acc.y), sm80::pack2<T>(acc.z, acc.w));
  }
}

// Many rows (a prefill split over a short grid: thousands of rows, a few
// splits each): one warp per row, four rows per CTA, no shared memory. Lane
// s holds split s's weight (at most 32 splits); each lane then owns float4
// columns q = lane, lane + 32 and runs over the splits with the weights
// broadcast by shuffle, four loads in flight. (The CTA-per-row kernel above
// took 28 us for B=1, 16 heads, S=512, 4 splits, D=64 on an H100 under ncu:
// 8192 CTAs of 128 threads, most of them idle.)
constexpr int kRowsPerCta = 4;
constexpr int kMaxWarpSplits = 32;

template <typename T>
__global__ void __launch_bounds__(kRowsPerCta * 32) combine_splits_warp_kernel(const ForwardParams p) {
  wait_for_producer_grid();
  const std::int64_t rows = static_cast<std::int64_t>(p.batch) * p.heads_q * p.max_q_len;
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * kRowsPerCta + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const auto [i, h, b, q_start, q_len] = combine_row(p, row);
  if (i >= q_len) return;  // the whole warp: no row of the batch
  const int splits = p.num_splits;

  const float lse_s = lane < splits ? p.lse_partial[lane * rows + row] : -INFINITY;
  float max_lse = lse_s;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  float weight = lse_weight(lse_s, max_lse);  // 0 for splits that saw no key
  float total = weight;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  weight = max_lse == -INFINITY ? 0.0f : weight / total;
  if (lane == 0 && p.lse != nullptr) {
    p.lse[lse_offset(p, b, q_start, i, h)] = merged_lse(max_lse, total);
  }

  const int quads = p.head_dim / 4;
  const float* partial = p.out_partial + row * p.head_dim;
  const std::int64_t split_stride = rows * p.head_dim;
  T* out = static_cast<T*>(p.out) + row_offset(p.out_strides, b, q_start, i, h);
#pragma unroll
  for (int q0 = 0; q0 < kMaxCombineDim / 4; q0 += 32) {
    const int q = q0 + lane;
    if (q0 >= quads) break;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    constexpr int kInFlight = 4;
    for (int s0 = 0; s0 < splits; s0 += kInFlight) {
      float4 x[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int s = s0 + u;
        x[u] = s < splits && q < quads ? reinterpret_cast<const float4*>(partial + s * split_stride)[q]
                                       : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const float w = __shfl_sync(0xffffffffu, weight, (s0 + u) & 31);  // 0 past the splits (lse -inf)
        acc.x += w * x[u].x;
        acc.y += w * x[u].y;
        acc.z += w * x[u].z;
        acc.w += w * x[u].w;
      }
    }
    if (q < quads)
      reinterpret_cast<uint2*>(out)[q] = make_uint2(sm80::pack2<T>(acc.x, acc.y), sm80::pack2<T>(acc.z, acc.w));
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
  if (p.head_dim > kMaxCombineDim || p.head_dim % 4 != 0)
    return Status(StatusCode::internal, "combine_splits: head_dim " + std::to_string(p.head_dim));
  if (rows > 2147483647LL) return Status::unsupported("combine_splits: more than 2^31 - 1 rows");
  // Few rows (decode): a CTA per row keeps the GPU's memory pipes full; many
  // rows with few splits (prefill): a warp per row, no idle threads.
  if (rows >= 2048 && p.num_splits <= kMaxWarpSplits) {
    const auto ctas = static_cast<unsigned>((rows + kRowsPerCta - 1) / kRowsPerCta);
    return launch_dependent(combine_splits_warp_kernel<T>, dim3(ctas), dim3(kRowsPerCta * 32), stream,
                            "combine_splits_warp_kernel", p);
  }
  return launch_dependent(combine_splits_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kCombineWarps * 32), stream,
                          "combine_splits_kernel", p);
}

namespace {
// out_partial: rows x splits of head_dim floats.
std::size_t out_partial_bytes(std::size_t rows, int head_dim, int splits) {
  return align256(rows * splits * head_dim * sizeof(float));
}
// Rows the combine merges into, from the Problem (sizing) or its params (placing).
std::size_t merged_rows(int batch, int heads_q, int max_q_len) {
  return static_cast<std::size_t>(batch) * heads_q * max_q_len;
}
}  // namespace

std::size_t split_partials_bytes(const Problem& problem, int splits) {
  if (splits <= 1) return 0;
  const std::size_t rows = merged_rows(problem.batch, problem.heads_q, problem.max_q_len);
  return out_partial_bytes(rows, problem.head_dim, splits) + align256(rows * splits * sizeof(float));
}

void place_split_partials(ForwardParams& p, int splits, void* workspace) {
  p.num_splits = splits;
  if (splits <= 1) return;
  auto* base = static_cast<unsigned char*>(workspace);
  p.out_partial = reinterpret_cast<float*>(base);
  p.lse_partial =
      reinterpret_cast<float*>(base + out_partial_bytes(merged_rows(p.batch, p.heads_q, p.max_q_len), p.head_dim, splits));
}

template Status launch_combine_splits<__half>(const ForwardParams&, cudaStream_t);
template Status launch_combine_splits<__nv_bfloat16>(const ForwardParams&, cudaStream_t);

}  // namespace cuflash::detail
