#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cuflash::tool {

ErrorStats compare(const host::HostTensor& got, const std::vector<double>& want) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double squared_error = 0.0, squared_norm = 0.0, max_abs = 0.0;
  const std::int64_t count = std::min<std::int64_t>(got.numel(), static_cast<std::int64_t>(want.size()));
  if (count != got.numel() || count != static_cast<std::int64_t>(want.size())) return {kInf, kInf};
  for (std::int64_t i = 0; i < count; ++i) {
    const double actual = got.get(i), expected = want[i];
    if (!std::isfinite(expected) || !std::isfinite(actual)) {
      if (actual == expected) continue;  // the same infinity
      return {kInf, kInf};
    }
    const double difference = std::abs(actual - expected);
    max_abs = std::max(max_abs, difference);
    squared_error += difference * difference;
    squared_norm += expected * expected;
  }
  const double rel_l2 = squared_norm > 0.0 ? std::sqrt(squared_error / squared_norm) : (squared_error > 0.0 ? kInf : 0.0);
  return {max_abs, rel_l2};
}

bool Tolerance::accepts(const ErrorStats& stats) const {
  return (on_max_abs ? stats.max_abs : stats.rel_l2) <= limit;
}

std::string Tolerance::describe() const {
  char text[64];
  std::snprintf(text, sizeof text, "%s <= %.0e", on_max_abs ? "max-abs" : "rel-L2", limit);
  return text;
}

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f16: return {false, 3e-3};
    case DType::bf16: return {false, 1e-2};
    default: return {true, 1e-5};
  }
}

bool report_errors(const std::vector<NamedError>& errors, const Tolerance& tolerance) {
  bool passed = true;
  std::printf("  vs float64:");
  for (std::size_t i = 0; i < errors.size(); ++i) {
    const NamedError& error = errors[i];
    std::printf("%s %s max-abs %.2e rel-L2 %.2e", i ? " |" : "", error.name, error.stats.max_abs, error.stats.rel_l2);
    passed = passed && tolerance.accepts(error.stats);
  }
  std::printf(" -> %s (%s)\n", passed ? "PASS" : "FAIL", tolerance.describe().c_str());
  return passed;
}

void report_timing(const char* pass, std::vector<double> times_ms, double flops, const char* clock) {
  std::sort(times_ms.begin(), times_ms.end());
  const std::size_t n = times_ms.size();
  const double median = n % 2 ? times_ms[n / 2] : 0.5 * (times_ms[n / 2 - 1] + times_ms[n / 2]);
  std::printf("%-9s %.3f ms median of %zu after a warm-up (%s, min %.3f, max %.3f), %.3g TFLOP/s (%.3g GFLOP)\n",
              pass, median, n, clock, times_ms.front(), times_ms.back(), flops / (median * 1e-3) / 1e12,
              flops / 1e9);
}

}  // namespace cuflash::tool
