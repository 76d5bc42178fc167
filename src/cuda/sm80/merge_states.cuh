// Launcher of the merge_states kernel (split-KV combine, cascades, ring attention).
#pragma once

#include <cuda_runtime_api.h>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

Status launch_merge_states(const MergeProblem& problem, cudaStream_t stream);

}  // namespace cuflash::detail
