// What backend=cudnn cannot run, decided from the problem alone (no cuDNN
// call): each refusal is `unsupported` naming the option, argument or value.
// What is left is up to cuDNN itself, which the backend asks by building the
// graph (a graph cuDNN cannot build is `unsupported` with cuDNN's reason).
#pragma once

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail::cudnn {

// Head dims cuDNN's fused attention takes (f16/bf16): multiples of 8 up to this.
inline constexpr int kMaxHeadDim = 256;

Status check_problem(const Problem& problem);

}  // namespace cuflash::detail::cudnn
