#include "host_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <utility>

#include "half_convert.hpp"

namespace cuflash::host {

double round_to(DType dtype, double value) {
  const float f = static_cast<float>(value);
  switch (dtype) {
    case DType::f32: return f;
    case DType::f16: return detail::f16_to_float(detail::float_to_f16(f));
    case DType::bf16: return detail::bf16_to_float(detail::float_to_bf16(f));
    case DType::i32: return static_cast<double>(static_cast<std::int32_t>(value));
  }
  return value;
}

HostTensor::HostTensor(DType dtype, std::vector<std::int64_t> shape, MemoryLayout layout)
    : dtype_(dtype), shape_(std::move(shape)) {
  const int rank = static_cast<int>(shape_.size());
  if (rank == 0 || rank > kMaxRank) throw std::invalid_argument("HostTensor: rank must be 1..5");
  std::vector<int> order = layout.memory_order;
  if (order.empty())
    for (int d = 0; d < rank; ++d) order.push_back(d);
  if (static_cast<int>(order.size()) != rank || order.back() != rank - 1)
    throw std::invalid_argument("HostTensor: memory_order must list every dimension and end with the last");
  strides_.assign(rank, 0);
  std::int64_t extent = shape_[rank - 1] + layout.row_padding;
  strides_[rank - 1] = 1;
  for (int k = rank - 2; k >= 0; --k) {
    strides_[order[k]] = extent;
    extent *= shape_[order[k]];
  }
  // At least one element so that even a zero-sized tensor has a real address.
  bytes_.assign(static_cast<std::size_t>(std::max<std::int64_t>(extent, 1)) * dtype_size(dtype_), std::byte{0});
}

HostTensor HostTensor::from_i32(const std::vector<std::int32_t>& values, std::vector<std::int64_t> shape) {
  HostTensor t(DType::i32, std::move(shape));
  if (static_cast<std::int64_t>(values.size()) != t.numel()) throw std::invalid_argument("from_i32: size mismatch");
  if (!values.empty()) std::memcpy(t.bytes_.data(), values.data(), values.size() * sizeof(std::int32_t));
  return t;
}

HostTensor HostTensor::from_f32(const std::vector<float>& values, std::vector<std::int64_t> shape) {
  HostTensor t(DType::f32, std::move(shape));
  if (static_cast<std::int64_t>(values.size()) != t.numel()) throw std::invalid_argument("from_f32: size mismatch");
  if (!values.empty()) std::memcpy(t.bytes_.data(), values.data(), values.size() * sizeof(float));
  return t;
}

std::int64_t HostTensor::numel() const {
  if (shape_.empty()) return 0;
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

TensorView HostTensor::view() const { return view_at(const_cast<std::byte*>(bytes_.data()), Device::host()); }

TensorView HostTensor::view_at(void* data, Device device) const {
  TensorView v;
  if (shape_.empty()) return v;
  v.data = data;
  v.dtype = dtype_;
  v.device = device;
  v.rank = static_cast<int>(shape_.size());
  for (int d = 0; d < v.rank; ++d) {
    v.shape[d] = shape_[d];
    v.strides[d] = strides_[d];
  }
  return v;
}

std::int64_t HostTensor::memory_offset(std::int64_t index) const {
  std::int64_t offset = 0;
  for (int d = static_cast<int>(shape_.size()) - 1; d >= 0; --d) {
    offset += (index % shape_[d]) * strides_[d];
    index /= shape_[d];
  }
  return offset;
}

double HostTensor::get(std::int64_t index) const {
  const std::byte* p = bytes_.data() + memory_offset(index) * dtype_size(dtype_);
  switch (dtype_) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, sizeof f);
      return f;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p, sizeof h);
      return dtype_ == DType::f16 ? detail::f16_to_float(h) : detail::bf16_to_float(h);
    }
    case DType::i32: {
      std::int32_t i;
      std::memcpy(&i, p, sizeof i);
      return i;
    }
  }
  return 0.0;
}

void HostTensor::set(std::int64_t index, double value) {
  std::byte* p = bytes_.data() + memory_offset(index) * dtype_size(dtype_);
  const float f = static_cast<float>(value);
  switch (dtype_) {
    case DType::f32: std::memcpy(p, &f, sizeof f); break;
    case DType::f16:
    case DType::bf16: {
      const std::uint16_t h = dtype_ == DType::f16 ? detail::float_to_f16(f) : detail::float_to_bf16(f);
      std::memcpy(p, &h, sizeof h);
      break;
    }
    case DType::i32: {
      const auto i = static_cast<std::int32_t>(value);
      std::memcpy(p, &i, sizeof i);
      break;
    }
  }
}

std::vector<double> HostTensor::to_doubles() const {
  std::vector<double> values(numel());
  for (std::int64_t i = 0; i < numel(); ++i) values[i] = get(i);
  return values;
}

void HostTensor::assign(const std::vector<double>& values) {
  if (static_cast<std::int64_t>(values.size()) != numel()) throw std::invalid_argument("assign: size mismatch");
  for (std::int64_t i = 0; i < numel(); ++i) set(i, values[i]);
}

void HostTensor::fill_normal(std::mt19937& engine, double stddev, double mean) {
  std::normal_distribution<double> normal(mean, stddev);
  for (std::int64_t i = 0; i < numel(); ++i) set(i, normal(engine));
}

void HostTensor::fill(double value) {
  for (std::int64_t i = 0; i < numel(); ++i) set(i, value);
}

void HostTensor::poison() {
  const std::size_t size = dtype_size(dtype_);
  const std::size_t count = bytes_.size() / size;
  for (std::size_t e = 0; e < count; ++e) {
    std::byte* p = bytes_.data() + e * size;
    switch (dtype_) {
      case DType::f32: {
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(p, &nan, size);
        break;
      }
      case DType::f16: {
        const std::uint16_t nan = 0x7e00;
        std::memcpy(p, &nan, size);
        break;
      }
      case DType::bf16: {
        const std::uint16_t nan = 0x7fc0;
        std::memcpy(p, &nan, size);
        break;
      }
      case DType::i32: {
        const std::int32_t garbage = static_cast<std::int32_t>(0x7fbadbad);
        std::memcpy(p, &garbage, size);
        break;
      }
    }
  }
}

std::int64_t HostTensor::count_nan() const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < numel(); ++i) n += std::isnan(get(i)) ? 1 : 0;
  return n;
}

}  // namespace cuflash::host
