// The few element-wise kernels ring attention needs around the attention
// calls: accumulators in fp32 (fill, add a partial, write out in the
// caller's dtype) and the varlen zigzag permutation to chunk-major order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash::detail {

// [B, H, S] float32 view: every element = value.
Status ring_fill(const TensorView& lse, float value, cudaStream_t stream);
// acc [B, S, H, D] float32 += part [B, S, H, D] (f32/f16/bf16); any strides.
Status ring_accumulate(const TensorView& acc, const TensorView& part, cudaStream_t stream);
// dst [B, S, H, D] (f32/f16/bf16) = src [B, S, H, D] (any float dtype); any strides.
Status ring_convert(const TensorView& dst, const TensorView& src, cudaStream_t stream);
// Varlen rows [T, H, D], each sequence b (rows cu[b]..cu[b+1]) made of
// `chunks` equal chunks, between the caller's order (sequence-major) and
// chunk-major order (chunk c of every sequence, then chunk c+1: each chunk
// is then a packed batch of its own with cu_seqlens cu / chunks).
// to_chunk_major: dst[chunk-major row] = src[row]; else the inverse.
Status ring_permute_rows(const TensorView& dst, const TensorView& src, const std::int32_t* cu_seqlens, int batch,
                         int chunks, bool to_chunk_major, cudaStream_t stream);
// chunk_cu[b] = cu[b] / chunks for b in [0, batch].
Status ring_chunk_cu_seqlens(std::int32_t* chunk_cu, const std::int32_t* cu_seqlens, int batch, int chunks,
                             cudaStream_t stream);

}  // namespace cuflash::detail
