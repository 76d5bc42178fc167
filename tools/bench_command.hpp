// `cuflash bench`: times attention_forward (and attention_backward) on the GPU
// over a list of shapes; the C++ half of bench/prefill.py.
#pragma once

#include "bench_config.hpp"

namespace cuflash::tool {

// Prints one line (or one JSON object) per point and backend. Returns 0 when
// every point ran, 1 when some failed or no GPU can run the benchmark.
int bench_command(const BenchConfig& config);

}  // namespace cuflash::tool
