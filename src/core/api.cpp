// The public entry points: validate, choose a backend, run.
#include "cuflash/cuflash.hpp"
#include "dispatch.hpp"
#include "empty_calls.hpp"
#include "validate.hpp"

namespace cuflash {

using detail::BackendImpl;
using detail::MergeProblem;
using detail::Problem;

const char* version() { return CUFLASH_VERSION; }

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::automatic:
    case Backend::cpu: return true;
    case Backend::cuda: return detail::cuda_backend() != nullptr && detail::cuda_backend()->available();
    case Backend::cudnn: return detail::cudnn_backend() != nullptr && detail::cudnn_backend()->available();
  }
  return false;
}

namespace {

// Validate, choose the backend, then hand both to `run`. A call with a zero
// extent that leaves nothing for a backend to compute (empty_calls.hpp: a
// forward that writes nothing, a backward whose gradients are all 0) goes to
// `no_kernel` instead, once the backend asked for is known to be usable here;
// what that backend's kernels support is not asked, as none runs.
template <typename Args, typename Validate, typename Run, typename NoKernel>
Status validated_call(const Args& args, const AttentionOptions& options, void* stream, Validate validate, Run run,
                      NoKernel no_kernel) {
  Problem problem;
  CUFLASH_TRY(validate(args, options, stream, &problem));
  if (detail::work_of(problem) != detail::Work::backend) {
    CUFLASH_TRY(detail::check_backend_placement(options.backend, problem.device, "q"));
    return no_kernel(problem);
  }
  BackendImpl* backend = nullptr;
  CUFLASH_TRY(detail::choose_backend(options.backend, problem, &backend));
  return run(*backend, problem);
}

// Backward without a (query, key) pair: every gradient is 0 (dsinks too: a
// row without keys has out = 0, so D_i = dot(dout_i, out_i) = 0).
Status write_zero_gradients(const Problem& problem, const RunContext& context) {
  CUFLASH_TRY(detail::fill_zeros(problem.dsinks, context.stream));
  CUFLASH_TRY(detail::fill_zeros(problem.dq, context.stream));
  CUFLASH_TRY(detail::fill_zeros(problem.dk, context.stream));
  return detail::fill_zeros(problem.dv, context.stream);
}

}  // namespace

Status attention_forward(const ForwardArgs& args, const AttentionOptions& options, const RunContext& context) {
  return validated_call(
      args, options, context.stream, detail::validate_forward,
      [&](BackendImpl& backend, const Problem& problem) { return backend.forward(problem, context); },
      // No query row: the debug probabilities hold no entry of a sequence (all 0).
      [&](const Problem& problem) { return detail::fill_zeros(problem.attn_probs, context.stream); });
}

Status attention_backward(const BackwardArgs& args, const AttentionOptions& options, const RunContext& context) {
  return validated_call(
      args, options, context.stream, detail::validate_backward,
      [&](BackendImpl& backend, const Problem& problem) { return backend.backward(problem, context); },
      [&](const Problem& problem) { return write_zero_gradients(problem, context); });
}

// Sizes are the same whatever the index contents, so the query copies nothing
// to the host and needs no stream. A call that runs no kernel needs none.
Status forward_workspace_size(const ForwardArgs& args, const AttentionOptions& options, std::size_t* bytes) {
  AttentionOptions shape_only = options;
  shape_only.check_index_contents = false;
  return validated_call(
      args, shape_only, nullptr, detail::validate_forward,
      [&](BackendImpl& backend, const Problem& problem) { return backend.workspace_size(problem, bytes); },
      [&](const Problem&) {
        *bytes = 0;
        return Status::success();
      });
}

Status backward_workspace_size(const BackwardArgs& args, const AttentionOptions& options, std::size_t* bytes) {
  AttentionOptions shape_only = options;
  shape_only.check_index_contents = false;
  return validated_call(
      args, shape_only, nullptr, detail::validate_backward,
      [&](BackendImpl& backend, const Problem& problem) { return backend.workspace_size(problem, bytes); },
      [&](const Problem&) {
        *bytes = 0;
        return Status::success();
      });
}

Status merge_states(const MergeArgs& args, Backend backend_choice, const RunContext& context) {
  MergeProblem problem;
  CUFLASH_TRY(detail::validate_merge(args, &problem));
  if (!detail::merge_has_rows(problem)) return detail::check_backend_placement(backend_choice, problem.device, "out_a");
  BackendImpl* backend = nullptr;
  CUFLASH_TRY(detail::choose_merge_backend(backend_choice, problem, &backend));
  return backend->merge_states(problem, context);
}

}  // namespace cuflash
