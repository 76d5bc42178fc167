// Kernel attributes that a launch needs, set once per (kernel, device) and
// not at every call: cudaFuncSetAttribute costs ~1-5 us of host time, which
// is a visible share of a 10-20 us attention call made from a hot loop.
#pragma once

#include <cstddef>

#include "cuflash/status.hpp"

namespace cuflash::detail {

// Lets `kernel` take `bytes` of dynamic shared memory on the current device
// (cudaFuncAttributeMaxDynamicSharedMemorySize); remembers what it has set.
Status allow_dynamic_smem(const void* kernel, int bytes, const char* kernel_name);

template <typename Kernel>
Status allow_dynamic_smem(Kernel* kernel, std::size_t bytes, const char* kernel_name) {
  return allow_dynamic_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(bytes), kernel_name);
}

}  // namespace cuflash::detail
