// Every CUDA call and every launch is checked; failures become Status values
// naming the call.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "cuflash/status.hpp"

namespace cuflash::detail {

inline Status cuda_status(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return {};
  return {StatusCode::cuda_error, std::string(what) + ": " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")"};
}

// After a <<<>>> launch: configuration errors show up here, not at the call.
inline Status launch_status(const char* kernel) { return cuda_status(cudaGetLastError(), kernel); }

// Makes `device` current for the scope of a call and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      error_ = cudaSetDevice(device);
      switched_ = error_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  Status status() const { return cuda_status(error_, "cudaSetDevice"); }

 private:
  int previous_ = 0;
  bool switched_ = false;
  cudaError_t error_ = cudaSuccess;
};

}  // namespace cuflash::detail
