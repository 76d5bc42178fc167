// The head dims the tensor-core kernels are instantiated for (src/cuda/inst),
// and the one place that turns a runtime head dim into the template argument.
#pragma once

#include <type_traits>

namespace cuflash::detail::sm80 {

inline constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};

// f(std::integral_constant<int, D>{}) for head_dim == D, else otherwise().
template <typename F, typename Otherwise>
decltype(auto) with_head_dim(int head_dim, F&& f, Otherwise&& otherwise) {
  switch (head_dim) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 96: return f(std::integral_constant<int, 96>{});
    case 128: return f(std::integral_constant<int, 128>{});
    case 192: return f(std::integral_constant<int, 192>{});
    case 256: return f(std::integral_constant<int, 256>{});
    default: return otherwise();
  }
}

}  // namespace cuflash::detail::sm80
