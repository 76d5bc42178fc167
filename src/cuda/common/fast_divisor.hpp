// Division by a divisor fixed for a whole launch (a grid's block counts, a
// head count), without the ~20-instruction dependent chain of a run-time
// integer division (I2F, MUFU.RCP, F2I and corrections): the host picks a
// multiplier and a shift once (Granlund and Montgomery's round-up method),
// and a quotient is a high multiply, an add and a shift. Exact for every
// divisor >= 1 and every dividend in [0, 2^31) (tests/cpu/fast_divisor_test.cpp).
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail {

struct FastDivisor {
  std::uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDivisor() = default;
  explicit constexpr FastDivisor(std::uint32_t d) : divisor(d) {
    while ((std::uint64_t{1} << shift) < d) ++shift;  // shift = ceil(log2 d)
    multiplier = static_cast<std::uint32_t>((std::uint64_t{1} << 32) * ((std::uint64_t{1} << shift) - d) / d + 1);
  }

  // n / divisor for 0 <= n < 2^31 (then the high product plus n stays below 2^32).
  CUFLASH_HOST_DEVICE constexpr int div(int n) const {
    const auto u = static_cast<std::uint32_t>(n);
#if defined(__CUDA_ARCH__)
    const std::uint32_t high = __umulhi(u, multiplier);
#else
    const auto high = static_cast<std::uint32_t>((std::uint64_t{u} * multiplier) >> 32);
#endif
    return static_cast<int>((high + u) >> shift);
  }
  CUFLASH_HOST_DEVICE constexpr int value() const { return static_cast<int>(divisor); }
};

}  // namespace cuflash::detail
