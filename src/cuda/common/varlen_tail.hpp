// Varlen backward: packed rows after cu_seqlens[B] belong to no sequence, yet
// the backward writes every element of dq, dk, dv (docs/semantics.md), so
// those rows get zeros. The row count lives on the device (cu_seqlens may not
// have been copied to the host), so a kernel reads it.
#pragma once

#include <cuda_runtime_api.h>

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash::detail {

// view: varlen [total, H, D] (any strides, last contiguous); cu_seqlens int32
// [batch + 1] on the device. Zeroes rows cu_seqlens[batch] .. total-1.
Status zero_rows_after_sequences(const TensorView& view, const void* cu_seqlens, int batch, cudaStream_t stream);

}  // namespace cuflash::detail
