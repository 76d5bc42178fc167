// Choosing the backend for a validated call: the one asked for, or for
// `auto` the first that supports it (host memory: cpu; GPU memory: the
// faster of cuda and cudnn for the call's shape by the measured table in
// auto_table.hpp, then the other). Both GPU backends compute the same
// function; a backend that cannot run the call says why, and nothing falls
// back silently to a different function.
#pragma once

#include "backend.hpp"

namespace cuflash::detail {

Status choose_backend(Backend requested, const Problem& problem, BackendImpl** chosen);
Status choose_linear_backend(Backend requested, const LinearProblem& problem, BackendImpl** chosen);
Status choose_merge_backend(Backend requested, const MergeProblem& problem, BackendImpl** chosen);
// For a call that runs no kernel (empty_calls.hpp): only that the backend asked
// for is built, usable here and matches where the tensors live (for auto on
// the GPU: that some GPU backend is), not what its kernels support.
// `first_tensor` names the tensor whose device decides ("q", "out_a").
Status check_backend_placement(Backend requested, Device device, const char* first_tensor);

}  // namespace cuflash::detail
