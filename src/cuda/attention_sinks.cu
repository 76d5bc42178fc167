#include "common/attention_sinks.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/element_io.cuh"
#include "common/scratch.hpp"
#include "softmax_merge.hpp"

namespace cuflash::detail {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp per row

// Where rows and their lse live: dense/KV cache [B, S, H, D] with lse
// [B, H, S]; varlen [T, H, D] with lse [H, T] (batch stride 0, rows offset by
// cu_seqlens).
struct SinkRows {
  const std::int32_t* cu_seqlens = nullptr;  // varlen
  int max_q_len = 0, heads = 0, head_dim = 0;
  RowStrides out, dout;
  std::int64_t lse_batch = 0, lse_head = 0, lse_row = 1;
  const float* sinks = nullptr;
  std::int64_t sink_stride = 1;

  __device__ bool row(int b, int i, int* first) const {  // false past the sequence
    if (cu_seqlens == nullptr) {
      *first = 0;
      return i < max_q_len;
    }
    *first = cu_seqlens[b];
    return i < cu_seqlens[b + 1] - cu_seqlens[b];
  }
};

SinkRows sink_rows(const Problem& p, const TensorView& lse) {
  SinkRows r;
  if (p.layout == Layout::varlen) r.cu_seqlens = static_cast<const std::int32_t*>(p.cu_seqlens_q.data);
  r.max_q_len = p.max_q_len;
  r.heads = p.heads_q;
  r.head_dim = p.head_dim;
  const Layout rows_layout = p.layout == Layout::varlen ? Layout::varlen : Layout::dense;
  r.out = row_strides(p.out, rows_layout);
  r.dout = row_strides(p.dout, rows_layout);
  if (p.layout == Layout::varlen) {
    r.lse_head = lse.strides[0];
    r.lse_row = lse.strides[1];
  } else {
    r.lse_batch = lse.strides[0];
    r.lse_head = lse.strides[1];
    r.lse_row = lse.strides[2];
  }
  r.sinks = static_cast<const float*>(p.sinks.data);
  r.sink_stride = p.sinks.strides[0];
  return r;
}

template <typename T>
__global__ void apply_sinks_kernel(SinkRows r, T* out, float* lse) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * kRowsPerBlock + threadIdx.y;
  int first = 0;
  if (!r.row(b, i, &first)) return;
  float* row_lse = lse + b * r.lse_batch + h * r.lse_head + static_cast<std::int64_t>(first + i) * r.lse_row;
  const MergedLse merged = merge_lse(*row_lse, r.sinks[h * r.sink_stride]);
  T* row = out + b * r.out.batch + static_cast<std::int64_t>(first + i) * r.out.row + h * r.out.head;
  for (int d = threadIdx.x; d < r.head_dim; d += 32) store_float(row + d, merged.weight_a * load_float(row + d));
  __syncwarp();
  if (threadIdx.x == 0) *row_lse = merged.lse;
}

// Per (block of rows, head, sequence): -sum of exp2((sink - lse) log2 e) * dot(dout, out).
template <typename T>
__global__ void sink_grad_partials_kernel(SinkRows r, const T* out, const T* dout, const float* lse, float* partials) {
  const int b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * kRowsPerBlock + threadIdx.y;
  __shared__ float warp_sums[kRowsPerBlock];
  float contribution = 0.0f;
  int first = 0;
  if (r.row(b, i, &first)) {
    const std::int64_t row = first + i;
    const T* o = out + b * r.out.batch + row * r.out.row + h * r.out.head;
    const T* g = dout + b * r.dout.batch + row * r.dout.row + h * r.dout.head;
    float dot = 0.0f;
    for (int d = threadIdx.x; d < r.head_dim; d += 32) dot += load_float(o + d) * load_float(g + d);
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float row_lse = lse[b * r.lse_batch + h * r.lse_head + row * r.lse_row];
    // lse = -inf only without keys and sinks, impossible with a sink: lse >= sink.
    contribution = -expf(r.sinks[h * r.sink_stride] - row_lse) * dot;
  }
  if (threadIdx.x == 0) warp_sums[threadIdx.y] = contribution;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    float sum = 0.0f;
    for (int w = 0; w < kRowsPerBlock; ++w) sum += warp_sums[w];
    partials[(static_cast<std::int64_t>(h) * gridDim.z + b) * gridDim.x + blockIdx.x] = sum;
  }
}

// One block per head: the partials in a fixed order.
__global__ void sink_grad_sum_kernel(const float* partials, std::int64_t per_head, float* dsinks, std::int64_t stride) {
  const int h = blockIdx.x;
  __shared__ float sums[256];
  float sum = 0.0f;
  for (std::int64_t k = threadIdx.x; k < per_head; k += blockDim.x) sum += partials[h * per_head + k];
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) sums[threadIdx.x] += sums[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) dsinks[h * stride] = sums[0];
}

dim3 row_grid(const Problem& p) {
  return dim3(static_cast<unsigned>((p.max_q_len + kRowsPerBlock - 1) / kRowsPerBlock),
              static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
}

}  // namespace

TensorView scratch_lse_view(const Problem& p, void* data) {
  if (p.layout == Layout::varlen)
    return make_view(data, DType::f32, {p.heads_q, p.q.shape[0]}, p.device);
  return make_view(data, DType::f32, {p.batch, p.heads_q, p.max_q_len}, p.device);
}

Status apply_attention_sinks(const Problem& p, const TensorView& lse, cudaStream_t stream) {
  if (!p.has_sinks || p.batch == 0 || p.heads_q == 0 || p.max_q_len == 0) return {};
  const SinkRows rows = sink_rows(p, lse);
  const dim3 block(32, kRowsPerBlock);
  auto* lse_data = static_cast<float*>(lse.data);
  switch (p.dtype) {
    case DType::f32: apply_sinks_kernel<<<row_grid(p), block, 0, stream>>>(rows, static_cast<float*>(p.out.data), lse_data); break;
    case DType::f16: apply_sinks_kernel<<<row_grid(p), block, 0, stream>>>(rows, static_cast<__half*>(p.out.data), lse_data); break;
    case DType::bf16:
      apply_sinks_kernel<<<row_grid(p), block, 0, stream>>>(rows, static_cast<__nv_bfloat16*>(p.out.data), lse_data);
      break;
    case DType::i32: return {StatusCode::internal, "attention sinks: int32 rows"};
  }
  return launch_status("apply_sinks_kernel");
}

std::size_t attention_sinks_backward_bytes(const Problem& p) {
  if (!p.has_sinks || p.dsinks.empty()) return 0;
  const dim3 grid = row_grid(p);
  return align256(static_cast<std::size_t>(grid.x) * grid.y * grid.z * sizeof(float));
}

Status attention_sinks_backward(const Problem& p, void* workspace, cudaStream_t stream) {
  if (!p.has_sinks || p.dsinks.empty()) return {};
  auto* dsinks = static_cast<float*>(p.dsinks.data);
  if (p.batch == 0 || p.max_q_len == 0) {  // no rows: the gradient is 0
    if (p.heads_q > 0)
      return cuda_status(cudaMemset2DAsync(dsinks, p.dsinks.strides[0] * sizeof(float), 0, sizeof(float), p.heads_q, stream),
                         "dsinks = 0");
    return {};
  }
  const SinkRows rows = sink_rows(p, p.lse);
  const dim3 grid = row_grid(p), block(32, kRowsPerBlock);
  auto* partials = static_cast<float*>(workspace);
  const auto* lse = static_cast<const float*>(p.lse.data);
  switch (p.dtype) {
    case DType::f32:
      sink_grad_partials_kernel<<<grid, block, 0, stream>>>(rows, static_cast<const float*>(p.out.data),
                                                            static_cast<const float*>(p.dout.data), lse, partials);
      break;
    case DType::f16:
      sink_grad_partials_kernel<<<grid, block, 0, stream>>>(rows, static_cast<const __half*>(p.out.data),
                                                            static_cast<const __half*>(p.dout.data), lse, partials);
      break;
    case DType::bf16:
      sink_grad_partials_kernel<<<grid, block, 0, stream>>>(rows, static_cast<const __nv_bfloat16*>(p.out.data),
                                                            static_cast<const __nv_bfloat16*>(p.dout.data), lse, partials);
      break;
    case DType::i32: return {StatusCode::internal, "attention sinks: int32 rows"};
  }
  CUFLASH_TRY(launch_status("sink_grad_partials_kernel"));
  const std::int64_t per_head = static_cast<std::int64_t>(grid.x) * grid.z;
  sink_grad_sum_kernel<<<p.heads_q, 256, 0, stream>>>(partials, per_head, dsinks, p.dsinks.strides[0]);
  return launch_status("sink_grad_sum_kernel");
}

}  // namespace cuflash::detail
