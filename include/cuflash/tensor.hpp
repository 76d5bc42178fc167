// TensorView: a non-owning, strided view of host or CUDA memory. cuflash never
// allocates or frees what a view points to.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace cuflash {

enum class DType { f32, f16, bf16, i32 };
enum class DeviceKind { host, cuda };

const char* dtype_name(DType dtype);
std::size_t dtype_size(DType dtype);

struct Device {
  DeviceKind kind = DeviceKind::host;
  int index = 0;  // CUDA ordinal; 0 for host

  static Device host() { return {DeviceKind::host, 0}; }
  static Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxRank = 5;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;  // 0 means "not given" for optional arguments
  std::int64_t shape[kMaxRank] = {};
  std::int64_t strides[kMaxRank] = {};  // in elements, not bytes

  // Not given (rank 0). A given view may still hold no element (an extent
  // of 0, numel() == 0): that is an empty tensor, not a missing one.
  bool empty() const { return rank == 0; }
  std::int64_t numel() const;
  bool is_contiguous() const;
};

// A row-major (contiguous) view.
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device = Device::host());
// A view with explicit strides (in elements), e.g. BHSD memory seen as BSHD.
TensorView make_strided_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                             std::initializer_list<std::int64_t> strides,
                             Device device = Device::host());

}  // namespace cuflash
