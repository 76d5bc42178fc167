// Host side of TMA: a CUtensorMap over one attention tensor
// (head_rows_tensor.hpp; rows past the end of a dense sequence read as
// zeros) whose box is `box_rows` rows x 64 columns of one head, 128-byte swizzled:
// exactly one 64-column block of the Sw128Tile layout the wgmma descriptors
// read (sm90/flash_fwd_wgmma_kernel.cuh). The encoder is the driver's
// cuTensorMapEncodeTiled, reached through the runtime's driver entry point
// so that the library does not link libcuda.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuflash/status.hpp"
#include "sm90/head_rows_tensor.hpp"

namespace cuflash::detail::sm90 {

// Whether TMA's limits allow a map of the tensor: 16-byte aligned base,
// strides multiples of 16 bytes below 2^40, no zero stride across more than
// one index (the tensor-core kernels' view checks already guarantee most).
bool tma_layout_ok(const HeadRowsTensor& t);

// Whether the driver's encoder (cuTensorMapEncodeTiled) is reachable: none
// on a machine without a CUDA driver.
bool tma_encoder_available();

Status encode_head_rows_map(CUtensorMap* map, const HeadRowsTensor& t, int box_rows, const char* name);

}  // namespace cuflash::detail::sm90
