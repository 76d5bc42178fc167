// Device building blocks of the float32 (SIMT) path: one warp owns one row of
// head_dim floats, lane l holding elements l, l+32, ... in registers; a dot
// product is a per-lane partial sum plus a butterfly over the warp, so every
// lane ends with the same value. Scores are computed in base e (as the
// semantics state them) so that no log2(e) rounding enters P or lse.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/attention_params.hpp"
#include "common/score_mask.cuh"
#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail::simt {

inline constexpr int kWarp = 32;
inline constexpr int kWarpsPerBlock = 4;
inline constexpr int kMaxHeadDim = 256;

// head_dim <= 32 * N elements, N in {1, 2, 4, 8}.
template <int N>
struct RowFrag {
  float x[N];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int t = 0; t < N; ++t) x[t] = 0.0f;
  }
  __device__ __forceinline__ void load(const float* row, int dim) {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int d = threadIdx.x + kWarp * t;
      x[t] = d < dim ? row[d] : 0.0f;
    }
  }
  __device__ __forceinline__ void store(float* row, int dim, float scale) const {
#pragma unroll
    for (int t = 0; t < N; ++t) {
      const int d = threadIdx.x + kWarp * t;
      if (d < dim) row[d] = x[t] * scale;
    }
  }
  // this = this * a + b * w
  __device__ __forceinline__ void scale_add(float a, float w, const RowFrag& b) {
#pragma unroll
    for (int t = 0; t < N; ++t) x[t] = fmaf(w, b.x[t], x[t] * a);
  }
  __device__ __forceinline__ void add(float w, const RowFrag& b) {
#pragma unroll
    for (int t = 0; t < N; ++t) x[t] = fmaf(w, b.x[t], x[t]);
  }
};

template <int N>
__device__ __forceinline__ float partial_dot(const RowFrag<N>& a, const RowFrag<N>& b) {
  float s = 0.0f;
#pragma unroll
  for (int t = 0; t < N; ++t) s = fmaf(a.x[t], b.x[t], s);
  return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = kWarp / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Two sums interleaved, so their shuffles overlap.
__device__ __forceinline__ void warp_sum2(float* a, float* b) {
#pragma unroll
  for (int m = kWarp / 2; m > 0; m /= 2) {
    *a += __shfl_xor_sync(0xffffffffu, *a, m);
    *b += __shfl_xor_sync(0xffffffffu, *b, m);
  }
}

// The (row, head, batch) a warp owns: warps are numbered row-fastest so that
// neighbouring warps read the same keys (or queries) through L2. The whole
// warp shares the result, so early returns keep warps converged.
struct WarpTask {
  int row, head, batch;
};

__device__ __forceinline__ bool warp_task(int rows, int heads, int batch, WarpTask* task) {
  const std::int64_t w = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.y;
  if (w >= static_cast<std::int64_t>(rows) * heads * batch) return false;
  const std::int64_t rest = w / rows;
  task->row = static_cast<int>(w % rows);
  task->head = static_cast<int>(rest % heads);
  task->batch = static_cast<int>(rest / heads);
  return true;
}

// Score of one (batch, query head) in base e, with the mask as index ranges.
// Ranges are computed in 64 bits: window sizes may be anything up to INT_MAX.
struct RowScore {
  float scale = 1.0f, softcap = 0.0f, slope = 0.0f;
  std::int64_t offset = 0;  // diagonal(): key j is aligned with query i when j = i + offset
  int q_len = 0, k_len = 0, window_left = -1, window_right = -1;

  // s = scale*dot; softcap*tanh(s/softcap); - slope*|i + offset - j|.
  // *squashed receives tanh(s/softcap) (softcap's backward factor), else 0.
  __device__ __forceinline__ float logit(float dot, int i, int j, float* squashed) const {
    float s = scale * dot;
    *squashed = 0.0f;
    if (softcap > 0.0f) {
      *squashed = tanhf(s / softcap);
      s = softcap * *squashed;
    }
    const std::int64_t distance = i + offset - j;
    return s - slope * static_cast<float>(distance < 0 ? -distance : distance);
  }
  // Keys [*lo, *hi) that query row i sees (exactly the visible set).
  __device__ __forceinline__ void keys_of_row(int i, int* lo, int* hi) const {
    const std::int64_t pos = i + offset;
    std::int64_t l = 0, h = k_len;
    if (window_left >= 0) l = max(l, pos - window_left);
    if (window_right >= 0) h = min(h, pos + window_right + 1);
    *lo = static_cast<int>(l);
    *hi = static_cast<int>(max(h, l));
  }
  // Query rows [*lo, *hi) that see key j (0 <= j < k_len).
  __device__ __forceinline__ void rows_of_key(int j, int* lo, int* hi) const {
    const std::int64_t base = static_cast<std::int64_t>(j) - offset;  // row whose position is j
    std::int64_t l = 0, h = q_len;
    if (window_right >= 0) l = max(l, base - window_right);
    if (window_left >= 0) h = min(h, base + window_left + 1);
    *lo = static_cast<int>(min(l, static_cast<std::int64_t>(q_len)));
    *hi = static_cast<int>(max(h, static_cast<std::int64_t>(*lo)));
  }
};

__device__ __forceinline__ RowScore row_score(const AttentionParams& p, const SeqBounds& s, int b, int h) {
  RowScore r;
  r.scale = p.softmax_scale;
  r.softcap = p.softcap;
  if (p.alibi_slopes != nullptr) r.slope = p.alibi_slopes[b * p.alibi_batch_stride + h * p.alibi_head_stride];
  r.offset = diagonal(p, s);
  r.q_len = s.q_len;
  r.k_len = s.k_len;
  r.window_left = p.window_left;
  r.window_right = p.window_right;
  return r;
}

template <typename T>
__device__ __forceinline__ T* row_ptr(T* base, const RowStrides& st, int b, int seq_start, int row, int h) {
  return base + row_offset(st, b, seq_start, row, h);
}

// ---- Host side of the launches.

// One warp per (row, head, batch); x is empty when there is no row.
// f32_attention_supports() has checked that the block count fits in x.
inline dim3 warp_grid(int batch, int heads, int rows) {
  const std::int64_t warps = static_cast<std::int64_t>(batch) * heads * rows;
  return dim3(static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
}

// Calls launch(std::integral_constant<int, N>) with the fragment size N that
// holds head_dim (<= kMaxHeadDim) floats per warp.
template <typename Launch>
Status with_frag_size(int head_dim, Launch&& launch) {
  if (head_dim <= 32) return launch(std::integral_constant<int, 1>{});
  if (head_dim <= 64) return launch(std::integral_constant<int, 2>{});
  if (head_dim <= 128) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, 8>{});
}

}  // namespace cuflash::detail::simt
