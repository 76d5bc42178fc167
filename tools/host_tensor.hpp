// A contiguous host tensor that owns its bytes: the tool's inputs, the
// templates of its outputs, and what it copies back from where the call ran.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cuflash/tensor.hpp"

namespace cuflash::tool {

struct HostTensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  // empty: not given
  std::vector<unsigned char> bytes;

  HostTensor() = default;
  HostTensor(DType dtype, std::vector<std::int64_t> shape);

  bool given() const { return !shape.empty(); }
  std::int64_t numel() const;
  // A row-major view of this shape over `data` (these bytes, or a copy of them elsewhere).
  TensorView view_at(void* data, Device device) const;
  TensorView view() const { return view_at(const_cast<unsigned char*>(bytes.data()), Device::host()); }

  double get(std::int64_t index) const;
  void set(std::int64_t index, double value);  // rounds to nearest even for f16/bf16
  std::int32_t* i32() { return reinterpret_cast<std::int32_t*>(bytes.data()); }
  const std::int32_t* i32() const { return reinterpret_cast<const std::int32_t*>(bytes.data()); }
};

HostTensor int32_tensor(const std::vector<std::int32_t>& values, std::vector<std::int64_t> shape);
void fill_normal(HostTensor* tensor, std::mt19937_64* engine);

}  // namespace cuflash::tool
