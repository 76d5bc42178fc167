#include "device_handle.hpp"

#include <memory>
#include <string>
#include <vector>

#include "cudnn_check.hpp"

namespace cuflash::detail::cudnn {

namespace {

struct DeviceSlot {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
};

// Slots are created under `registry_mutex` and never freed: a lease keeps a
// pointer to its slot while other devices' slots are added. Handles are never
// destroyed either: at process exit the CUDA context may already be gone, and
// cudnnDestroy then would fail or crash; the driver reclaims everything.
DeviceSlot& slot_of(int device) {
  static std::mutex registry_mutex;
  static std::vector<std::unique_ptr<DeviceSlot>> slots;
  std::lock_guard<std::mutex> lock(registry_mutex);
  if (device < 0) device = 0;
  while (static_cast<int>(slots.size()) <= device) slots.push_back(std::make_unique<DeviceSlot>());
  return *slots[device];
}

}  // namespace

Status HandleLease::bind(cudaStream_t stream) const {
  return cudnn_status(cudnnSetStream(handle_, stream), "cudnnSetStream");
}

Status lease_handle(int device, HandleLease* lease) {
  DeviceSlot& slot = slot_of(device);
  std::unique_lock<std::mutex> lock(slot.mutex);
  if (slot.handle == nullptr) {
    cudnnHandle_t handle = nullptr;
    CUFLASH_TRY(cudnn_status(cudnnCreate(&handle), ("cudnnCreate on CUDA device " + std::to_string(device)).c_str()));
    slot.handle = handle;
  }
  lease->lock_ = std::move(lock);
  lease->handle_ = slot.handle;
  return {};
}

}  // namespace cuflash::detail::cudnn
