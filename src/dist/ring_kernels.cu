#include "ring_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_check.hpp"
#include "common/element_io.cuh"

namespace cuflash::detail {
namespace {

// A [B, S, H, D] view's addressing (rank 4; varlen [T, H, D] is seen as B = 1).
struct Rows4 {
  void* data;
  std::int64_t s0, s1, s2, s3;
  std::int64_t n1, n2, n3;
};

Rows4 rows4(const TensorView& v) {
  if (v.rank == 3) return {v.data, 0, v.strides[0], v.strides[1], v.strides[2], v.shape[0], v.shape[1], v.shape[2]};
  return {v.data, v.strides[0], v.strides[1], v.strides[2], v.strides[3], v.shape[1], v.shape[2], v.shape[3]};
}

__device__ __forceinline__ std::int64_t at(const Rows4& r, std::int64_t index) {
  const std::int64_t i3 = index % r.n3;
  std::int64_t rest = index / r.n3;
  const std::int64_t i2 = rest % r.n2;
  rest /= r.n2;
  const std::int64_t i1 = rest % r.n1;
  const std::int64_t i0 = rest / r.n1;
  return i0 * r.s0 + i1 * r.s1 + i2 * r.s2 + i3 * r.s3;
}

template <typename Dst, typename Src, bool kAdd>
__global__ void elementwise_kernel(Rows4 dst, Rows4 src, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    Dst* d = static_cast<Dst*>(dst.data) + at(dst, i);
    const float x = load_float(static_cast<const Src*>(src.data) + at(src, i));
    store_float(d, kAdd ? load_float(d) + x : x);
  }
}

__global__ void fill_kernel(Rows4 dst, std::int64_t count, float value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    static_cast<float*>(dst.data)[at(dst, i)] = value;
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 65536 ? blocks : 65536);
}

std::int64_t element_count(const TensorView& v) { return v.numel(); }

template <typename Dst, bool kAdd>
Status launch_from(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  const std::int64_t count = element_count(dst);
  if (count == 0) return {};
  const Rows4 d = rows4(dst), s = rows4(src);
  switch (src.dtype) {
    case DType::f32: elementwise_kernel<Dst, float, kAdd><<<grid_for(count), 256, 0, stream>>>(d, s, count); break;
    case DType::f16: elementwise_kernel<Dst, __half, kAdd><<<grid_for(count), 256, 0, stream>>>(d, s, count); break;
    case DType::bf16:
      elementwise_kernel<Dst, __nv_bfloat16, kAdd><<<grid_for(count), 256, 0, stream>>>(d, s, count);
      break;
    case DType::i32: return {StatusCode::internal, "ring: int32 rows"};
  }
  return launch_status(kAdd ? "ring accumulate" : "ring convert");
}

__device__ int sequence_of(const std::int32_t* cu, int batch, std::int32_t row) {
  int lo = 0, hi = batch - 1;  // the last b with cu[b] <= row
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= row) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// One block per caller-order row; threads over its H*D elements (16-bit or
// 32-bit, copied as bytes' worth of 16-bit words).
__global__ void permute_kernel(Rows4 dst, Rows4 src, const std::int32_t* cu, int batch, int chunks, bool forward,
                               int element_words) {
  const std::int32_t row = blockIdx.x;
  if (row < cu[0] || row >= cu[batch]) return;  // packed rows of no sequence
  const int b = sequence_of(cu, batch, row);
  const std::int32_t chunk_len = (cu[b + 1] - cu[b]) / chunks;
  if (chunk_len == 0) return;
  const std::int32_t position = row - cu[b];
  const int chunk = position / chunk_len;
  const std::int32_t chunk_rows = cu[batch] / chunks;
  const std::int32_t moved = chunk * chunk_rows + cu[b] / chunks + position % chunk_len;
  const std::int32_t dst_row = forward ? moved : row, src_row = forward ? row : moved;
  const std::int64_t elements = dst.n2 * dst.n3;
  for (std::int64_t e = threadIdx.x; e < elements; e += blockDim.x) {
    const std::int64_t h = e / dst.n3, d = e % dst.n3;
    const std::int64_t to = dst_row * dst.s1 + h * dst.s2 + d * dst.s3;
    const std::int64_t from = src_row * src.s1 + h * src.s2 + d * src.s3;
    if (element_words == 2)
      static_cast<float*>(dst.data)[to] = static_cast<const float*>(src.data)[from];
    else
      static_cast<std::uint16_t*>(dst.data)[to] = static_cast<const std::uint16_t*>(src.data)[from];
  }
}

__global__ void chunk_cu_kernel(std::int32_t* chunk_cu, const std::int32_t* cu, int batch, int chunks) {
  for (int b = threadIdx.x; b <= batch; b += blockDim.x) chunk_cu[b] = cu[b] / chunks;
}

}  // namespace

Status ring_fill(const TensorView& lse, float value, cudaStream_t stream) {
  const std::int64_t count = element_count(lse);
  if (count == 0) return {};
  TensorView as4 = lse;  // [B, H, S] -> [1, B, H, S]
  if (lse.rank == 3) as4 = TensorView{lse.data, lse.dtype, lse.device, 4, {1, lse.shape[0], lse.shape[1], lse.shape[2]},
                                      {0, lse.strides[0], lse.strides[1], lse.strides[2]}};
  else if (lse.rank == 2) as4 = TensorView{lse.data, lse.dtype, lse.device, 4, {1, 1, lse.shape[0], lse.shape[1]},
                                           {0, 0, lse.strides[0], lse.strides[1]}};
  fill_kernel<<<grid_for(count), 256, 0, stream>>>(rows4(as4), count, value);
  return launch_status("ring fill");
}

Status ring_accumulate(const TensorView& acc, const TensorView& part, cudaStream_t stream) {
  if (acc.dtype != DType::f32) return {StatusCode::internal, "ring: accumulators are float32"};
  return launch_from<float, true>(acc, part, stream);
}

Status ring_convert(const TensorView& dst, const TensorView& src, cudaStream_t stream) {
  switch (dst.dtype) {
    case DType::f32: return launch_from<float, false>(dst, src, stream);
    case DType::f16: return launch_from<__half, false>(dst, src, stream);
    case DType::bf16: return launch_from<__nv_bfloat16, false>(dst, src, stream);
    case DType::i32: break;
  }
  return {StatusCode::internal, "ring: int32 rows"};
}

Status ring_permute_rows(const TensorView& dst, const TensorView& src, const std::int32_t* cu_seqlens, int batch,
                         int chunks, bool to_chunk_major, cudaStream_t stream) {
  const std::int64_t rows = src.shape[0];
  if (rows == 0 || batch == 0) return {};
  const int words = dtype_size(src.dtype) == 4 ? 2 : 1;
  permute_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(rows4(dst), rows4(src), cu_seqlens, batch, chunks,
                                                                 to_chunk_major, words);
  return launch_status("ring permute");
}

Status ring_chunk_cu_seqlens(std::int32_t* chunk_cu, const std::int32_t* cu_seqlens, int batch, int chunks,
                             cudaStream_t stream) {
  chunk_cu_kernel<<<1, 256, 0, stream>>>(chunk_cu, cu_seqlens, batch, chunks);
  return launch_status("ring chunk cu_seqlens");
}

}  // namespace cuflash::detail
