#include <algorithm>

#include "cuflash/tensor.hpp"

namespace cuflash {

std::int64_t TensorView::numel() const {
  std::int64_t count = 1;
  for (int d = 0; d < rank; ++d) count *= shape[d];
  return rank == 0 ? 0 : count;
}

bool TensorView::is_contiguous() const {
  std::int64_t expected = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

namespace {
TensorView view_with_shape(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.rank = static_cast<int>(std::min<std::size_t>(shape.size(), kMaxRank));
  std::copy_n(shape.begin(), view.rank, view.shape);
  return view;
}
}  // namespace

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape, Device device) {
  TensorView view = view_with_shape(data, dtype, shape, device);
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    view.strides[d] = stride;
    stride *= view.shape[d];
  }
  return view;
}

TensorView make_strided_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                             std::initializer_list<std::int64_t> strides, Device device) {
  TensorView view = view_with_shape(data, dtype, shape, device);
  std::copy_n(strides.begin(), std::min<std::size_t>(strides.size(), view.rank), view.strides);
  return view;
}

}  // namespace cuflash
