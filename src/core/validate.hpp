// The one validation layer. Every shape, stride, dtype, device, pointer,
// index-content and option check of the API lives here and is shared by all
// backends. On failure the Status names the argument, what was expected and
// what was given, and nothing has been written anywhere.
#pragma once

#include "cuflash/attention.hpp"
#include "cuflash/linear_attention.hpp"
#include "cuflash/merge_states.hpp"
#include "linear_problem.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// `stream` is used only to copy GPU-resident index tensors to the host when
// options.check_index_contents is set.
Status validate_forward(const ForwardArgs& args, const AttentionOptions& options, void* stream,
                        Problem* problem);
Status validate_backward(const BackwardArgs& args, const AttentionOptions& options, void* stream,
                         Problem* problem);
Status validate_merge(const MergeArgs& args, MergeProblem* problem);

// Linear attention (validate_linear.cpp), the same discipline.
Status validate_linear_forward(const LinearForwardArgs& args, const LinearAttentionOptions& options, void* stream,
                               LinearProblem* problem);
Status validate_linear_backward(const LinearBackwardArgs& args, const LinearAttentionOptions& options, void* stream,
                                LinearProblem* problem);
Status validate_linear_step(const LinearStepArgs& args, const LinearAttentionOptions& options, LinearProblem* problem);

}  // namespace cuflash::detail
