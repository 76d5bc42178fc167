// Where a call runs: copies of the host tensors in host memory or, in a CUDA
// build, in GPU memory; and timing by steady_clock or CUDA events. CUDA
// failures throw std::runtime_error naming the call.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "cuflash/tensor.hpp"
#include "host_tensor.hpp"

namespace cuflash::tool {

enum class Placement { host, cuda };

// CUDA GPUs visible to this process; 0 when built without CUDA or on any error.
int cuda_device_count();
bool built_with_cuda();
// Why no CUDA device is usable here ("this cuflash was built without CUDA",
// the cudaGetDeviceCount error, ...); empty when one is.
std::string no_cuda_device_reason();
std::string cuda_device_name(int index);

class Buffer {
 public:
  Buffer() = default;
  // Room for `like`'s bytes; given only when `like` is.
  Buffer(Placement placement, const host::HostTensor& like);
  Buffer(Buffer&& other) noexcept { swap(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    swap(other);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  static Buffer raw(Placement placement, std::size_t bytes);  // untyped scratch (workspace)

  void upload(const host::HostTensor& from);
  void download(host::HostTensor* to) const;
  // All bytes 0xff: NaN in f32, f16 and bf16, so an unwritten output shows.
  void poison();
  TensorView view() const { return view_; }
  void* data() const { return data_; }

 private:
  void swap(Buffer& other) noexcept;

  Placement placement_ = Placement::host;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  TensorView view_;
};

// Times one call: steady_clock on the host; CUDA events on the default stream
// for the GPU, which wait for the call to finish.
class CallTimer {
 public:
  explicit CallTimer(Placement placement);
  ~CallTimer();
  CallTimer(const CallTimer&) = delete;
  CallTimer& operator=(const CallTimer&) = delete;

  void start();
  double stop_ms();

 private:
  Placement placement_;
  std::chrono::steady_clock::time_point host_start_;
  void* start_event_ = nullptr;
  void* stop_event_ = nullptr;
};

// Waits for all work queued on the GPU; nothing on the host.
void synchronize(Placement placement);

}  // namespace cuflash::tool
