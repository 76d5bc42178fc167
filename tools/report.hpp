// What `cuflash run` prints: timings and errors against the float64 oracle,
// and the per-dtype tolerance that decides the exit code.
#pragma once

#include <string>
#include <vector>

#include "cuflash/tensor.hpp"
#include "host_tensor.hpp"

namespace cuflash::tool {

struct ErrorStats {
  double max_abs = 0.0;
  double rel_l2 = 0.0;  // ||got - want|| / ||want||
};

// Elementwise, in row-major order. Equal infinities (lse = -inf of a row that
// sees no key) count as exact; any other non-finite value makes both errors inf.
ErrorStats compare(const host::HostTensor& got, const std::vector<double>& want);

struct Tolerance {
  bool on_max_abs = true;  // else on rel-L2
  double limit = 0.0;
  bool accepts(const ErrorStats& stats) const;
  std::string describe() const;  // "max-abs <= 1e-05"
};

// f32: max-abs <= 1e-5; f16: rel-L2 <= 3e-3; bf16: rel-L2 <= 1e-2.
Tolerance tolerance_for(DType dtype);

struct NamedError {
  const char* name;
  ErrorStats stats;
};

// One line of errors; returns whether all are within the tolerance.
bool report_errors(const std::vector<NamedError>& errors, const Tolerance& tolerance);

// "forward:  12.345 ms median of 5 (steady_clock), 0.348 TFLOP/s (4.29 GFLOP)"
void report_timing(const char* pass, std::vector<double> times_ms, double flops, const char* clock);

}  // namespace cuflash::tool
