#include "common/kernel_attributes.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>
#include <vector>

#include "common/cuda_check.hpp"

namespace cuflash::detail {

namespace {

struct SetAttribute {
  const void* kernel;
  int device;
  int bytes;
};

}  // namespace

Status allow_dynamic_smem(const void* kernel, int bytes, const char* kernel_name) {
  if (bytes <= 48 * 1024) return {};  // within the default limit: nothing to set
  int device = 0;
  CUFLASH_TRY(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  static std::mutex mutex;
  static std::vector<SetAttribute> done;  // a few dozen kernels at most
  std::lock_guard<std::mutex> lock(mutex);
  for (const SetAttribute& entry : done)
    if (entry.kernel == kernel && entry.device == device && entry.bytes >= bytes) return {};
  const std::string what = std::string("cudaFuncSetAttribute(") + kernel_name + ")";
  CUFLASH_TRY(cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), what.c_str()));
  for (SetAttribute& entry : done)
    if (entry.kernel == kernel && entry.device == device) {
      entry.bytes = bytes;
      return {};
    }
  done.push_back({kernel, device, bytes});
  return {};
}

}  // namespace cuflash::detail
