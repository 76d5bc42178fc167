#pragma once

#include "run_config.hpp"

namespace cuflash::tool {

// Builds, runs, times and checks the problem; returns the process exit code
// (0 passed, 1 failed or over tolerance).
int run_command(const RunConfig& config);

}  // namespace cuflash::tool
