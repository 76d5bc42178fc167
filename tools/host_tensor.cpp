#include "host_tensor.hpp"

#include <cstring>
#include <stdexcept>

#include "half_convert.hpp"

namespace cuflash::tool {

HostTensor::HostTensor(DType dtype_, std::vector<std::int64_t> shape_)
    : dtype(dtype_), shape(std::move(shape_)) {
  bytes.resize(static_cast<std::size_t>(numel()) * dtype_size(dtype));
}

std::int64_t HostTensor::numel() const {
  if (shape.empty()) return 0;
  std::int64_t count = 1;
  for (std::int64_t extent : shape) count *= extent;
  return count;
}

TensorView HostTensor::view_at(void* data, Device device) const {
  TensorView view;
  if (!given()) return view;
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) throw std::logic_error("tensor rank above kMaxRank");
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(shape.size());
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.shape[d] = shape[d];
    view.strides[d] = stride;
    stride *= shape[d];
  }
  return view;
}

double HostTensor::get(std::int64_t index) const {
  const unsigned char* at = bytes.data() + index * dtype_size(dtype);
  switch (dtype) {
    case DType::f32: {
      float value;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case DType::i32: {
      std::int32_t value;
      std::memcpy(&value, at, sizeof value);
      return value;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t half;
      std::memcpy(&half, at, sizeof half);
      return dtype == DType::f16 ? detail::f16_to_float(half) : detail::bf16_to_float(half);
    }
  }
  return 0.0;
}

void HostTensor::set(std::int64_t index, double value) {
  unsigned char* at = bytes.data() + index * dtype_size(dtype);
  switch (dtype) {
    case DType::f32: {
      const float stored = static_cast<float>(value);
      std::memcpy(at, &stored, sizeof stored);
      return;
    }
    case DType::i32: {
      const auto stored = static_cast<std::int32_t>(value);
      std::memcpy(at, &stored, sizeof stored);
      return;
    }
    case DType::f16:
    case DType::bf16: {
      const float narrow = static_cast<float>(value);
      const std::uint16_t half = dtype == DType::f16 ? detail::float_to_f16(narrow) : detail::float_to_bf16(narrow);
      std::memcpy(at, &half, sizeof half);
      return;
    }
  }
}

HostTensor int32_tensor(const std::vector<std::int32_t>& values, std::vector<std::int64_t> shape) {
  HostTensor tensor(DType::i32, std::move(shape));
  if (static_cast<std::size_t>(tensor.numel()) != values.size()) throw std::logic_error("int32_tensor: size mismatch");
  std::memcpy(tensor.bytes.data(), values.data(), values.size() * sizeof(std::int32_t));
  return tensor;
}

void fill_normal(HostTensor* tensor, std::mt19937_64* engine) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::int64_t count = tensor->numel();
  for (std::int64_t i = 0; i < count; ++i) tensor->set(i, normal(*engine));
}

}  // namespace cuflash::tool
