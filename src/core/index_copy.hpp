// Host copies of int32 index tensors (cu_seqlens, seqlens_k, block_table), so
// their contents can be checked before anything is written.
#pragma once

#include <cstdint>
#include <vector>

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash::detail {

// `view` is rank 1 or 2 with a contiguous last dimension (already checked).
// GPU tensors are copied on `stream` (a cudaStream_t), which waits for it.
Status copy_index_tensor(const TensorView& view, const char* name, void* stream, std::vector<std::int32_t>* values);

// Whether this build can touch CUDA memory at all.
bool built_with_cuda();

}  // namespace cuflash::detail
