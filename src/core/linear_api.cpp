// The linear-attention entry points: validate, choose a backend, run. Calls
// with zero extents go to the backend too: a sequence without rows still
// writes its final state (the initial one, or 0).
#include "cuflash/linear_attention.hpp"
#include "dispatch.hpp"
#include "validate.hpp"

namespace cuflash {

namespace {

template <typename Run>
Status run_linear(const detail::LinearProblem& problem, Backend requested, Run run) {
  detail::BackendImpl* backend = nullptr;
  CUFLASH_TRY(detail::choose_linear_backend(requested, problem, &backend));
  return run(*backend);
}

}  // namespace

Status linear_attention_forward(const LinearForwardArgs& args, const LinearAttentionOptions& options,
                                const RunContext& context) {
  detail::LinearProblem problem;
  CUFLASH_TRY(detail::validate_linear_forward(args, options, context.stream, &problem));
  return run_linear(problem, options.backend,
                    [&](detail::BackendImpl& backend) { return backend.linear_forward(problem, context); });
}

Status linear_attention_backward(const LinearBackwardArgs& args, const LinearAttentionOptions& options,
                                 const RunContext& context) {
  detail::LinearProblem problem;
  CUFLASH_TRY(detail::validate_linear_backward(args, options, context.stream, &problem));
  return run_linear(problem, options.backend,
                    [&](detail::BackendImpl& backend) { return backend.linear_backward(problem, context); });
}

Status linear_attention_step(const LinearStepArgs& args, const LinearAttentionOptions& options,
                             const RunContext& context) {
  detail::LinearProblem problem;
  CUFLASH_TRY(detail::validate_linear_step(args, options, &problem));
  return run_linear(problem, options.backend,
                    [&](detail::BackendImpl& backend) { return backend.linear_forward(problem, context); });
}

}  // namespace cuflash
