#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "common/cuda_check.hpp"
#include "cudnn_kernels.hpp"

namespace cuflash::detail::cudnn {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(std::int64_t items) {
  return static_cast<unsigned>(std::clamp<std::int64_t>((items + kThreads - 1) / kThreads, 1, 4096));
}

__device__ int q_length(const DeviceLengths& lengths, int b) {
  return lengths.cu_q != nullptr ? lengths.cu_q[b + 1] - lengths.cu_q[b] : lengths.q_len;
}

__device__ int kv_length(const DeviceLengths& lengths, int b) {
  if (lengths.cu_kv != nullptr) return lengths.cu_kv[b + 1] - lengths.cu_kv[b];
  if (lengths.seqlens_kv != nullptr) return lengths.seqlens_kv[b];
  return lengths.kv_len;
}

// The sequence b and its row i of visit row r; false for a packed row after
// the last sequence. cu: that side's cu_seqlens (packed only).
__device__ bool locate(const RowSpace& space, const std::int32_t* cu, std::int64_t r, int* b, std::int64_t* i) {
  if (!space.packed) {
    *b = static_cast<int>(r / space.rows_per_sequence);
    *i = r % space.rows_per_sequence;
    return true;
  }
  if (r >= cu[space.batch]) return false;
  int lo = 0, hi = space.batch;  // cu[lo] <= r < cu[hi]: the last sequence starting at or before r
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (cu[mid] <= r) lo = mid;
    else hi = mid;
  }
  *b = lo;
  *i = r - cu[lo];
  return true;
}

__device__ std::int64_t element(const RowView& view, int b, std::int64_t i, std::int64_t r, int h) {
  return (view.packed ? r * view.row_stride : b * view.batch_stride + i * view.row_stride) + h * view.head_stride;
}

__device__ void zero_row(const RowView& view, std::int64_t at, int head_dim) {
  auto* row = static_cast<std::uint16_t*>(view.data) + at;  // f16/bf16: zero bits are 0
  for (int d = 0; d < head_dim; ++d) row[d] = 0;
}

// Row i of a sequence with q_len queries over kv_len keys sees no key.
__device__ bool row_is_empty(std::int64_t i, int q_len, int kv_len, int window_right) {
  return kv_len == 0 || (window_right >= 0 && i + (kv_len - q_len) + window_right < 0);
}

// Key j is seen by no query.
__device__ bool key_is_unseen(std::int64_t j, int q_len, int kv_len, int window_left) {
  return q_len == 0 || (window_left >= 0 && j < kv_len - q_len - window_left);
}

__global__ void index_kernel(IndexArgs args) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > args.batch) return;
  if (b < args.batch) {
    if (args.q_lengths != nullptr) args.q_lengths[b] = q_length(args.lengths, b);
    if (args.kv_lengths != nullptr) args.kv_lengths[b] = kv_length(args.lengths, b);
  }
  for (int o = 0; o < args.offset_count; ++o) {
    const std::int32_t* cu = args.offsets[o].side == Side::q ? args.lengths.cu_q : args.lengths.cu_kv;
    args.offsets[o].out[b] = static_cast<std::int64_t>(cu[b]) * args.offsets[o].token_stride;
  }
}

__host__ __device__ std::int64_t items_of(const RowSpace& rows) {
  return (rows.packed ? rows.total_rows : rows.batch * rows.rows_per_sequence) * rows.heads;
}

// visit(b, i, r, h) for every head h of every row that belongs to a sequence:
// row i of sequence b, row r of the tensor. Grid-stride, heads varying
// fastest, so that neighbouring threads touch neighbouring token-major stats.
template <typename Visit>
__device__ void for_each_row(const RowSpace& space, const std::int32_t* cu, Visit visit) {
  const std::int64_t items = items_of(space);
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < items;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = idx / space.heads;
    const int h = static_cast<int>(idx % space.heads);
    int b = 0;
    std::int64_t i = 0;
    if (locate(space, cu, r, &b, &i)) visit(b, i, r, h);
  }
}

__global__ void forward_fix_kernel(ForwardFixArgs args) {
  for_each_row(args.rows, args.lengths.cu_q, [&](int b, std::int64_t i, std::int64_t r, int h) {
    const int q_len = q_length(args.lengths, b), kv_len = kv_length(args.lengths, b);
    if (i >= q_len) return;
    const bool empty = args.fix_empty_rows && row_is_empty(i, q_len, kv_len, args.window_right);
    if (args.lse.data != nullptr && (empty || args.stats.data != nullptr)) {
      const float value =
          empty ? -INFINITY : static_cast<const float*>(args.stats.data)[element(args.stats, b, i, r, h)];
      static_cast<float*>(args.lse.data)[element(args.lse, b, i, r, h)] = value;
    }
    if (empty) zero_row(args.out, element(args.out, b, i, r, h), args.head_dim);
  });
}

__global__ void backward_stats_kernel(BackwardStatsArgs args) {
  for_each_row(args.rows, args.lengths.cu_q, [&](int b, std::int64_t i, std::int64_t r, int h) {
    if (i >= q_length(args.lengths, b)) return;
    const float value = static_cast<const float*>(args.lse.data)[element(args.lse, b, i, r, h)];
    static_cast<float*>(args.stats.data)[element(args.stats, b, i, r, h)] = value == -INFINITY ? INFINITY : value;
  });
}

__global__ void backward_fix_kernel(BackwardFixArgs args) {
  const std::int32_t* cu = args.side == Side::q ? args.lengths.cu_q : args.lengths.cu_kv;
  for_each_row(args.rows, cu, [&](int b, std::int64_t i, std::int64_t r, int h) {
    const int q_len = q_length(args.lengths, b), kv_len = kv_length(args.lengths, b);
    if (args.side == Side::q) {
      if (i < q_len && row_is_empty(i, q_len, kv_len, args.window_right))
        zero_row(args.first, element(args.first, b, i, r, h), args.head_dim);
    } else if (i < kv_len && key_is_unseen(i, q_len, kv_len, args.window_left)) {
      zero_row(args.first, element(args.first, b, i, r, h), args.head_dim);
      zero_row(args.second, element(args.second, b, i, r, h), args.head_dim);
    }
  });
}

}  // namespace

Status launch_index_kernel(const IndexArgs& args, cudaStream_t stream) {
  index_kernel<<<blocks_for(args.batch + 1), kThreads, 0, stream>>>(args);
  return launch_status("cudnn index_kernel");
}

Status launch_forward_fix(const ForwardFixArgs& args, cudaStream_t stream) {
  if (items_of(args.rows) == 0) return {};
  forward_fix_kernel<<<blocks_for(items_of(args.rows)), kThreads, 0, stream>>>(args);
  return launch_status("cudnn forward_fix_kernel");
}

Status launch_backward_stats(const BackwardStatsArgs& args, cudaStream_t stream) {
  if (items_of(args.rows) == 0) return {};
  backward_stats_kernel<<<blocks_for(items_of(args.rows)), kThreads, 0, stream>>>(args);
  return launch_status("cudnn backward_stats_kernel");
}

Status launch_backward_fix(const BackwardFixArgs& args, cudaStream_t stream) {
  if (items_of(args.rows) == 0) return {};
  backward_fix_kernel<<<blocks_for(items_of(args.rows)), kThreads, 0, stream>>>(args);
  return launch_status("cudnn backward_fix_kernel");
}

}  // namespace cuflash::detail::cudnn
