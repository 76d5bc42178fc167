// The public entry points: validate, choose a backend, run.
#include "cuflash/cuflash.hpp"
#include "dispatch.hpp"
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

// Validate, choose the backend, then hand both to `run`.
template <typename Args, typename Validate, typename Run>
Status validated_call(const Args& args, const AttentionOptions& options, void* stream, Validate validate, Run run) {
  Problem problem;
  CUFLASH_TRY(validate(args, options, stream, &problem));
  BackendImpl* backend = nullptr;
  CUFLASH_TRY(detail::choose_backend(options.backend, problem, &backend));
  return run(*backend, problem);
}

}  // namespace

Status attention_forward(const ForwardArgs& args, const AttentionOptions& options, const RunContext& context) {
  return validated_call(args, options, context.stream, detail::validate_forward,
                        [&](BackendImpl& backend, const Problem& problem) { return backend.forward(problem, context); });
}

Status attention_backward(const BackwardArgs& args, const AttentionOptions& options, const RunContext& context) {
  return validated_call(args, options, context.stream, detail::validate_backward,
                        [&](BackendImpl& backend, const Problem& problem) { return backend.backward(problem, context); });
}

// Sizes are the same whatever the index contents, so the query copies nothing
// to the host and needs no stream.
Status forward_workspace_size(const ForwardArgs& args, const AttentionOptions& options, std::size_t* bytes) {
  AttentionOptions shape_only = options;
  shape_only.check_index_contents = false;
  return validated_call(args, shape_only, nullptr, detail::validate_forward,
                        [&](BackendImpl& backend, const Problem& problem) { return backend.workspace_size(problem, bytes); });
}

Status backward_workspace_size(const BackwardArgs& args, const AttentionOptions& options, std::size_t* bytes) {
  AttentionOptions shape_only = options;
  shape_only.check_index_contents = false;
  return validated_call(args, shape_only, nullptr, detail::validate_backward,
                        [&](BackendImpl& backend, const Problem& problem) { return backend.workspace_size(problem, bytes); });
}

Status merge_states(const MergeArgs& args, Backend backend_choice, const RunContext& context) {
  MergeProblem problem;
  CUFLASH_TRY(detail::validate_merge(args, &problem));
  BackendImpl* backend = nullptr;
  CUFLASH_TRY(detail::choose_merge_backend(backend_choice, problem, &backend));
  return backend->merge_states(problem, context);
}

}  // namespace cuflash
