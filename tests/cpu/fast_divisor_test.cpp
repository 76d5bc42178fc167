// FastDivisor (src/cuda/common/fast_divisor.hpp) against the plain division:
// every divisor up to 4096 over the dividends near each multiple of it, and
// random divisors and dividends over the whole range it promises.
#include "common/fast_divisor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>

namespace {

using cuflash::detail::FastDivisor;

TEST(FastDivisor, SmallDivisorsAroundTheirMultiples) {
  for (int d = 1; d <= 4096; ++d) {
    const FastDivisor fd(static_cast<std::uint32_t>(d));
    for (int q = 0; q < 40; ++q)
      for (int r = -1; r <= 1; ++r) {
        const int n = q * d + r;
        if (n < 0) continue;
        ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
      }
    for (int n : {0x7fffffff, 0x7ffffffe, 0x40000000, 0x3fffffff}) ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
  }
}

TEST(FastDivisor, RandomDivisorsAndDividends) {
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> dividend(0, 0x7fffffff);
  for (int trial = 0; trial < 2000; ++trial) {
    const int d = 1 + static_cast<int>(rng() % (trial % 2 ? 0x7fffffffu : 1u << 16));
    const FastDivisor fd(static_cast<std::uint32_t>(d));
    for (int i = 0; i < 500; ++i) {
      const int n = dividend(rng);
      ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
    }
    // The largest dividend, and the multiples of d next to it.
    for (int n : {0x7fffffff, 0x7fffffff / d * d, 0x7fffffff / d * d - 1}) {
      if (n < 0) continue;
      ASSERT_EQ(fd.div(n), n / d) << n << " / " << d;
    }
  }
}

}  // namespace
