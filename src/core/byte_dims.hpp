// A tensor view's memory as byte-addressed dimensions: what the overlap
// checks (tensor_checks.cpp) and the zero fill of empty calls (empty_calls.cpp)
// walk.
#pragma once

#include <cstdint>
#include <vector>

#include "cuflash/tensor.hpp"

namespace cuflash::detail {

struct ByteDim {
  std::int64_t extent;
  std::int64_t stride;  // bytes
};

// The view's dimensions in bytes, the element's own bytes as the innermost one,
// sorted by stride, largest first. Size-1 dimensions are dropped: they never
// move the address.
std::vector<ByteDim> byte_dims(const TensorView& view);

}  // namespace cuflash::detail
