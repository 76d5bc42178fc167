// Host tensors that own their bytes behind a TensorView, in any dtype and in
// contiguous, permuted (e.g. BHSD memory seen as BSHD) or padded layouts;
// element access in logical row-major order with rounding to the dtype;
// normal fills and NaN poisoning. Backend-neutral: to run elsewhere, copy
// bytes() to that memory and use view_at(pointer, device).
//
// Shared by the `cuflash` command (tools/) and the test suites (tests/), as
// the library cuflash_host_tensor; it depends on the public API only (no gtest).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "cuflash/tensor.hpp"

namespace cuflash::host {

// How a tensor's elements are placed in memory. memory_order lists the logical
// dimensions from outermost to innermost in memory and must end with the last
// dimension (the API requires a unit last stride); empty means row-major.
// row_padding extra elements follow every innermost row.
struct MemoryLayout {
  std::vector<int> memory_order;
  std::int64_t row_padding = 0;

  static MemoryLayout row_major() { return {}; }
  // For a rank-4 [B, S, H, D] tensor: memory [B, H, S, D].
  static MemoryLayout bhsd() { return {{0, 2, 1, 3}, 0}; }
  static MemoryLayout padded(std::int64_t padding) { return {{}, padding}; }
};

class HostTensor {
 public:
  // An empty tensor: no shape, an empty view (an argument not given).
  HostTensor() = default;
  // Zero-filled; rank 1..kMaxRank.
  HostTensor(DType dtype, std::vector<std::int64_t> shape, MemoryLayout layout = {});
  static HostTensor from_i32(const std::vector<std::int32_t>& values, std::vector<std::int64_t> shape);
  static HostTensor from_f32(const std::vector<float>& values, std::vector<std::int64_t> shape);

  bool empty() const { return shape_.empty(); }
  DType dtype() const { return dtype_; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  const std::vector<std::int64_t>& strides() const { return strides_; }
  std::int64_t numel() const;

  // A view of the owned bytes; an empty view for an empty tensor.
  TensorView view() const;
  // The same shape and strides over other memory holding a copy of bytes(),
  // e.g. a device buffer.
  TensorView view_at(void* data, Device device) const;

  // All bytes, padding included: the unit to copy to a device and back.
  std::vector<std::byte>& bytes() { return bytes_; }
  const std::vector<std::byte>& bytes() const { return bytes_; }

  // Element `index` in logical row-major order.
  double get(std::int64_t index) const;
  // Stores `value` rounded to the dtype (round-to-nearest-even).
  void set(std::int64_t index, double value);
  std::vector<double> to_doubles() const;
  void assign(const std::vector<double>& values);

  // Fresh normal(mean, stddev) values, rounded to the dtype.
  void fill_normal(std::mt19937& engine, double stddev = 1.0, double mean = 0.0);
  void fill(double value);
  // Every byte of the allocation, padding included, becomes NaN (i32: a
  // recognizable garbage pattern), so that unwritten elements show.
  void poison();
  // Logical elements that are NaN.
  std::int64_t count_nan() const;

 private:
  std::int64_t memory_offset(std::int64_t index) const;

  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  std::vector<std::int64_t> strides_;
  std::vector<std::byte> bytes_;
};

// Rounds a double to what a dtype can hold, and back.
double round_to(DType dtype, double value);

}  // namespace cuflash::host
