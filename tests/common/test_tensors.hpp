// What the tests add to the host tensors of tools/host_tensor.hpp (which the
// `cuflash` command shares): random inputs that can be reproduced from a
// printed seed, error metrics against float64 references, and gtest
// assertions on poisoned outputs.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuflash/tensor.hpp"
#include "host_tensor.hpp"

namespace cuflash::test {

using host::HostTensor;
using host::MemoryLayout;
using host::round_to;

// A random generator whose seed is fresh per test (from std::random_device),
// or CUFLASH_TEST_SEED when that environment variable is set, so that a
// failure printed with its seed can be replayed.
class TestRng {
 public:
  TestRng();
  std::uint32_t seed() const { return seed_; }
  std::mt19937& engine() { return engine_; }
  std::string trace() const;  // "seed: rerun with CUFLASH_TEST_SEED=1234"
  int uniform_int(int lo, int hi);  // inclusive

 private:
  std::uint32_t seed_;
  std::mt19937 engine_;
};

// Declares a TestRng named `name` and makes every failure in this scope print its seed.
#define CUFLASH_TEST_RNG(name)       \
  ::cuflash::test::TestRng name;     \
  SCOPED_TRACE(name.trace())

// Error of a tensor against a float64 reference of its logical shape.
// Reference values that only arise structurally must be matched exactly: NaN
// ("must stay unwritten") by NaN, -inf (lse of a row that sees no key) by
// -inf, and exact 0 (out of such a row, gradient of a key no query sees) by 0
// (by default every zero reference is such a value; see compare_zeros_where).
// Any other NaN or infinity in the tested tensor is a mismatch too; a
// mismatch makes both norms infinite, so NaN never passes.
struct ErrorStats {
  double max_abs = 0.0;
  double rel_l2 = 0.0;         // ||got - ref|| / ||ref|| over finite references
  double max_abs_floor1 = 0.0; // max |got - ref| / max(1, |ref|): for values like lse whose error grows with them
  double ref_max_abs = 0.0;    // largest |ref|: the scale of the output
  std::int64_t mismatches = 0; // structural (NaN, inf, exact 0) disagreements
  std::int64_t worst_index = -1;
  double worst_ref = 0.0, worst_got = 0.0;
  std::int64_t compared = 0;

  std::string describe() const;
};

ErrorStats compare(const HostTensor& got, const std::vector<double>& ref);
// As compare, but a zero reference must be matched exactly only where
// exact_zero[i]: for gradients, where an exact 0 can also come from exact
// cancellation (one visible key: dS = P (dP - D) = 0) that fp32 need not reproduce.
ErrorStats compare_zeros_where(const HostTensor& got, const std::vector<double>& ref,
                               const std::vector<bool>& exact_zero);

// Whether every logical element of the tensor was written (no poison NaN left).
::testing::AssertionResult all_written(const HostTensor& tensor, const char* name);
// Bitwise equality of the whole allocation.
bool same_bytes(const HostTensor& a, const HostTensor& b);

}  // namespace cuflash::test
