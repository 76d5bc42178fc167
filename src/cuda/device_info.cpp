#include "common/device_info.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "sm90/tma_map.hpp"

namespace cuflash::detail {

const DeviceInfo& device_info(int device) {
  static std::mutex mutex;
  static std::vector<DeviceInfo> cache;
  std::lock_guard<std::mutex> lock(mutex);
  if (device < 0) device = 0;
  if (static_cast<int>(cache.size()) <= device) cache.resize(device + 1);
  DeviceInfo& info = cache[device];
  if (!info.valid) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
      info.sm_count = prop.multiProcessorCount;
      info.major = prop.major;
      info.minor = prop.minor;
      info.max_smem_per_block = static_cast<int>(prop.sharedMemPerBlockOptin);
      info.smem_per_sm = static_cast<int>(prop.sharedMemPerMultiprocessor);
      info.tma_encoder = sm90::tma_encoder_available();
      info.valid = true;
    }
  }
  return info;
}

}  // namespace cuflash::detail
