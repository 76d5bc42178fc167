// One cuDNN handle per GPU, bound to the caller's stream for each call.
// cuDNN allows a handle in one thread at a time, so every use (building a
// graph, binding a stream and launching) holds that device's lock through a
// HandleLease; launches are asynchronous, so the lock is held for microseconds.
#pragma once

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <mutex>

#include "cuflash/status.hpp"

namespace cuflash::detail::cudnn {

class HandleLease {
 public:
  HandleLease() = default;
  cudnnHandle_t handle() const { return handle_; }
  // The calls that follow run on `stream` (the caller's; nullptr: the legacy default stream).
  Status bind(cudaStream_t stream) const;

 private:
  friend Status lease_handle(int device, HandleLease* lease);
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

// Locks `device`'s handle, creating it on first use; `device` must be the
// current CUDA device (DeviceGuard), as cudnnCreate binds the current one.
Status lease_handle(int device, HandleLease* lease);

}  // namespace cuflash::detail::cudnn
