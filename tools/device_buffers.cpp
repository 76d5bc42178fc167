#include "device_buffers.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <utility>

#ifdef CUFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cuflash::tool {
namespace {

#ifdef CUFLASH_WITH_CUDA
void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(result) + ": " +
                             cudaGetErrorString(result));
}
#endif

[[noreturn, maybe_unused]] void no_cuda() { throw std::runtime_error("this cuflash was built without CUDA"); }

}  // namespace

int cuda_device_count() {
#ifdef CUFLASH_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: no driver or no device is not an error here
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::string no_cuda_device_reason() {
#ifdef CUFLASH_WITH_CUDA
  int count = 0;
  if (const cudaError_t result = cudaGetDeviceCount(&count); result != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorName(result) + ": " + cudaGetErrorString(result);
  }
  return count > 0 ? std::string() : "cudaGetDeviceCount found none";
#else
  return "this cuflash was built without CUDA";
#endif
}

bool built_with_cuda() {
#ifdef CUFLASH_WITH_CUDA
  return true;
#else
  return false;
#endif
}

std::string cuda_device_name(int index) {
#ifdef CUFLASH_WITH_CUDA
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, index), "cudaGetDeviceProperties");
  return std::string(properties.name) + " (sm_" + std::to_string(properties.major) +
         std::to_string(properties.minor) + ", CUDA device " + std::to_string(index) + ")";
#else
  (void)index;
  no_cuda();
#endif
}

Buffer Buffer::raw(Placement placement, std::size_t bytes) {
  Buffer buffer;
  buffer.placement_ = placement;
  buffer.bytes_ = bytes;
  if (bytes == 0) return buffer;
  if (placement == Placement::host) {
    buffer.data_ = std::malloc(bytes);
    if (buffer.data_ == nullptr)
      throw std::runtime_error("out of host memory (allocating " + std::to_string(bytes) + " bytes)");
    return buffer;
  }
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaMalloc(&buffer.data_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
#else
  no_cuda();
#endif
  return buffer;
}

Buffer::Buffer(Placement placement, const host::HostTensor& like) {
  if (like.empty()) return;
  *this = raw(placement, like.bytes().size());
  view_ = like.view_at(data_, placement == Placement::host ? Device::host() : Device::cuda(0));
}

Buffer::~Buffer() {
  if (data_ == nullptr) return;
  if (placement_ == Placement::host) {
    std::free(data_);
    return;
  }
#ifdef CUFLASH_WITH_CUDA
  cudaFree(data_);  // a destructor cannot report; a failed free leaks at worst
#endif
}

void Buffer::swap(Buffer& other) noexcept {
  std::swap(placement_, other.placement_);
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  std::swap(view_, other.view_);
}

void Buffer::upload(const host::HostTensor& from) {
  if (bytes_ == 0) return;
  if (from.bytes().size() != bytes_) throw std::logic_error("Buffer::upload: size mismatch");
  if (placement_ == Placement::host) {
    std::memcpy(data_, from.bytes().data(), bytes_);
    return;
  }
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaMemcpy(data_, from.bytes().data(), bytes_, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
#endif
}

void Buffer::download(host::HostTensor* to) const {
  if (bytes_ == 0) return;
  if (to->bytes().size() != bytes_) throw std::logic_error("Buffer::download: size mismatch");
  if (placement_ == Placement::host) {
    std::memcpy(to->bytes().data(), data_, bytes_);
    return;
  }
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaMemcpy(to->bytes().data(), data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
#endif
}

void Buffer::poison() {
  if (bytes_ == 0) return;
  if (placement_ == Placement::host) {
    std::memset(data_, 0xff, bytes_);
    return;
  }
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaMemset(data_, 0xff, bytes_), "cudaMemset");
#endif
}

CallTimer::CallTimer(Placement placement) : placement_(placement) {
  if (placement_ == Placement::host) return;
#ifdef CUFLASH_WITH_CUDA
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  start_event_ = start;
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  stop_event_ = stop;
#else
  no_cuda();
#endif
}

CallTimer::~CallTimer() {
#ifdef CUFLASH_WITH_CUDA
  if (start_event_) cudaEventDestroy(static_cast<cudaEvent_t>(start_event_));
  if (stop_event_) cudaEventDestroy(static_cast<cudaEvent_t>(stop_event_));
#endif
}

void CallTimer::start() {
  if (placement_ == Placement::host) {
    host_start_ = std::chrono::steady_clock::now();
    return;
  }
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaEventRecord(static_cast<cudaEvent_t>(start_event_), nullptr), "cudaEventRecord");
#endif
}

double CallTimer::stop_ms() {
  if (placement_ == Placement::host)
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - host_start_).count();
  float elapsed_ms = 0.0f;
#ifdef CUFLASH_WITH_CUDA
  const auto stop = static_cast<cudaEvent_t>(stop_event_);
  check_cuda(cudaEventRecord(stop, nullptr), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
  check_cuda(cudaEventElapsedTime(&elapsed_ms, static_cast<cudaEvent_t>(start_event_), stop), "cudaEventElapsedTime");
#endif
  return elapsed_ms;
}

void synchronize(Placement placement) {
  if (placement == Placement::host) return;
#ifdef CUFLASH_WITH_CUDA
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

}  // namespace cuflash::tool
