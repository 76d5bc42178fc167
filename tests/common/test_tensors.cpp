#include "test_tensors.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

namespace cuflash::test {
namespace {

std::uint32_t fresh_seed() {
  if (const char* env = std::getenv("CUFLASH_TEST_SEED"); env != nullptr && *env != '\0')
    return static_cast<std::uint32_t>(std::strtoul(env, nullptr, 10));
  std::random_device device;
  return device();
}

}  // namespace

TestRng::TestRng() : seed_(fresh_seed()), engine_(seed_) {}

std::string TestRng::trace() const { return "random inputs: rerun with CUFLASH_TEST_SEED=" + std::to_string(seed_); }

int TestRng::uniform_int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(engine_); }

std::string ErrorStats::describe() const {
  std::ostringstream s;
  s << "max_abs=" << max_abs << " rel_l2=" << rel_l2 << " max_abs/max(1,|ref|)=" << max_abs_floor1 << " ref_max_abs=" << ref_max_abs
    << " non_finite_mismatches=" << mismatches << " compared=" << compared;
  if (worst_index >= 0) s << " worst: index " << worst_index << " ref " << worst_ref << " got " << worst_got;
  return s.str();
}

namespace {

// Reference values that arise only structurally must be matched exactly:
// NaN ("stays unwritten"), -inf (lse of a row that sees no key) and 0 (the
// output of such a row, the gradient of a key no query sees).
void accumulate(ErrorStats& st, std::int64_t i, double got, double ref, bool exact_zero, double& err2, double& ref2) {
  ++st.compared;
  auto note_mismatch = [&] {
    if (st.mismatches++ == 0) {
      st.worst_index = i;
      st.worst_ref = ref;
      st.worst_got = got;
    }
  };
  if (!std::isfinite(ref)) {
    const bool match = std::isnan(ref) ? std::isnan(got) : got == ref;
    if (!match) note_mismatch();
    return;
  }
  st.ref_max_abs = std::max(st.ref_max_abs, std::abs(ref));
  if (!std::isfinite(got) || (exact_zero && ref == 0.0 && got != 0.0)) {
    note_mismatch();
    return;
  }
  const double diff = std::abs(got - ref);
  st.max_abs_floor1 = std::max(st.max_abs_floor1, diff / std::max(1.0, std::abs(ref)));
  err2 += diff * diff;
  ref2 += ref * ref;
  if (diff > st.max_abs) {
    st.max_abs = diff;
    if (st.mismatches == 0) {
      st.worst_index = i;
      st.worst_ref = ref;
      st.worst_got = got;
    }
  }
}

void finish(ErrorStats& st, double err2, double ref2) {
  if (st.mismatches > 0) {
    st.max_abs = st.rel_l2 = st.max_abs_floor1 = std::numeric_limits<double>::infinity();
    return;
  }
  st.rel_l2 = ref2 > 0.0 ? std::sqrt(err2 / ref2) : (err2 > 0.0 ? std::numeric_limits<double>::infinity() : 0.0);
}

}  // namespace

ErrorStats compare(const HostTensor& got, const std::vector<double>& ref) {
  return compare_zeros_where(got, ref, std::vector<bool>(ref.size(), true));
}

ErrorStats compare_zeros_where(const HostTensor& got, const std::vector<double>& ref,
                               const std::vector<bool>& exact_zero) {
  ErrorStats st;
  if (static_cast<std::int64_t>(ref.size()) != got.numel() || exact_zero.size() != ref.size()) {
    st.mismatches = 1;
    finish(st, 0.0, 0.0);
    return st;
  }
  double err2 = 0.0, ref2 = 0.0;
  for (std::int64_t i = 0; i < got.numel(); ++i) accumulate(st, i, got.get(i), ref[i], exact_zero[i], err2, ref2);
  finish(st, err2, ref2);
  return st;
}

::testing::AssertionResult all_written(const HostTensor& tensor, const char* name) {
  const std::int64_t nan = tensor.count_nan();
  if (nan == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": " << nan << " of " << tensor.numel()
                                       << " elements still hold the NaN poison";
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.bytes().size() == b.bytes().size() && std::memcmp(a.bytes().data(), b.bytes().data(), a.bytes().size()) == 0;
}

}  // namespace cuflash::test
