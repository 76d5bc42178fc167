// `cuflash bench --mode decode` (or --sweep decode): times the KV-cache
// forward of a decode step on the GPU, contiguous or paged caches, and
// reports GB/s of K and V read; the C++ half of bench/decode.py.
#pragma once

#include <string>

#include "bench_config.hpp"

namespace cuflash::tool {

// Prints one line (or one JSON object) per point and backend on device 0
// (already current, named `device`, compute capability `sm`). Returns 0 when
// every point ran or was skipped for lack of memory, 1 when some failed.
int bench_decode(const BenchConfig& config, const std::string& device, int sm);

}  // namespace cuflash::tool
