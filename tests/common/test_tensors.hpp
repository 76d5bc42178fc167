// Host tensors for tests: owned bytes behind a TensorView, in any dtype and in
// contiguous, permuted (e.g. BHSD memory seen as BSHD) or padded layouts;
// random fills that can be reproduced from a printed seed; NaN poisoning; and
// error metrics against float64 references. Backend-neutral: a GPU test copies
// bytes() to the device and uses view_at(device_pointer, device).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cuflash/tensor.hpp"

namespace cuflash::test {

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
  HostTensor() = default;
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

// Rounds a double to what a dtype can hold, and back.
double round_to(DType dtype, double value);

}  // namespace cuflash::test
