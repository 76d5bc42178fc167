// What the fp16/bf16 tensor-core kernels (forward and backward) can take:
// dtype, head dim, layout, compute capability, and 16-byte aligned rows for
// cp.async. Answers `unsupported` with the reason; touches no memory.
#pragma once

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"
#include "problem.hpp"
#include "sm80/head_dims.hpp"

namespace cuflash::detail {

// Checks dtype, head dim, layout, device and q/k/v views.
Status sm80_attention_supports(const Problem& problem, const char* pass);
// Data pointer 16-byte aligned and every stride but the last a multiple of 8
// elements, so each row starts on a 16-byte boundary.
Status check_kernel_view(const TensorView& view, const char* name);

}  // namespace cuflash::detail
