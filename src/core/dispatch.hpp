// Choosing the backend for a validated call: the one asked for, or for
// `auto` the first that supports it (host memory: cpu; GPU memory: cuda,
// then cudnn). A backend that cannot run the call says why; nothing falls
// back silently to a different function.
#pragma once

#include "backend.hpp"

namespace cuflash::detail {

Status choose_backend(Backend requested, const Problem& problem, BackendImpl** chosen);
Status choose_merge_backend(Backend requested, const MergeProblem& problem, BackendImpl** chosen);

}  // namespace cuflash::detail
