// Host side of TMA: a CUtensorMap over one attention tensor (q, k or v seen
// as [batch, rows, heads, D] of 2-byte elements with the caller's strides)
// whose box is `box_rows` rows x 64 columns of one head, 128-byte swizzled:
// exactly one 64-column block of the Sw128Tile layout the wgmma descriptors
// read (sm90/flash_fwd_wgmma_kernel.cuh). The encoder is the driver's
// cuTensorMapEncodeTiled, reached through the runtime's driver entry point
// so that the library does not link libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/attention_params.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail::sm90 {

// Dimensions are (innermost first) D, rows, heads, batch; a varlen tensor is
// one batch of `rows` = total packed rows. Rows past the end of a sequence
// of a dense tensor read as zeros.
struct HeadRowsTensor {
  const void* base = nullptr;
  std::int64_t batch = 1, rows = 0, heads = 0;
  int head_dim = 0;
  RowStrides strides;  // elements
};

// Whether the map can be built (TMA's limits: 16-byte aligned base,
// strides multiples of 16 bytes below 2^40, no zero stride across more than
// one index); the tensor-core kernels' view checks already guarantee most.
bool tma_can_map(const HeadRowsTensor& t);

Status encode_head_rows_map(CUtensorMap* map, const HeadRowsTensor& t, int box_rows, const char* name);

}  // namespace cuflash::detail::sm90
