#include "dispatch.hpp"

#include <string>

#include "auto_table.hpp"
#include "tensor_checks.hpp"

namespace cuflash::detail {

namespace {

BackendImpl* backend_of(Backend kind) {
  switch (kind) {
    case Backend::cpu: return cpu_backend();
    case Backend::cuda: return cuda_backend();
    case Backend::cudnn: return cudnn_backend();
    case Backend::automatic: return nullptr;
  }
  return nullptr;
}

// The requested backend, if it is built, usable here and runs where the
// tensors live. `first_tensor` names the tensor whose device decides.
Status explicit_backend(Backend requested, Device device, const char* first_tensor, BackendImpl** chosen) {
  const std::string name = backend_name(requested);
  const bool wants_host = requested == Backend::cpu;
  if (wants_host != (device.kind == DeviceKind::host))
    return Status::invalid(std::string(first_tensor) + ": backend " + name + " needs " +
                           (wants_host ? "host" : "CUDA") + " memory, got " + device_string(device));
  BackendImpl* impl = backend_of(requested);
  if (impl == nullptr) return Status::unsupported("backend " + name + ": not compiled into this build of cuflash");
  if (!impl->available()) return Status::unsupported("backend " + name + ": no usable GPU on this machine");
  *chosen = impl;
  return {};
}

// `first_gpu`: the GPU backend auto tries first; the other is tried when it cannot run the call.
template <typename ProblemT, typename Supports>
Status choose(Backend requested, const ProblemT& problem, const char* first_tensor, Supports supports,
              Backend first_gpu, BackendImpl** chosen) {
  if (requested != Backend::automatic) {
    CUFLASH_TRY(explicit_backend(requested, problem.device, first_tensor, chosen));
    return supports(**chosen);
  }
  if (problem.device.kind == DeviceKind::host) {
    *chosen = cpu_backend();
    return supports(**chosen);
  }
  std::string reasons;
  const Backend second_gpu = first_gpu == Backend::cuda ? Backend::cudnn : Backend::cuda;
  for (Backend candidate : {first_gpu, second_gpu}) {
    BackendImpl* impl = nullptr;
    Status status = explicit_backend(candidate, problem.device, first_tensor, &impl);
    if (status.ok()) status = supports(*impl);
    if (status.ok()) {
      *chosen = impl;
      return {};
    }
    reasons += std::string(reasons.empty() ? "" : "; ") + status.message();
  }
  return Status::unsupported("backend auto: no GPU backend runs this call (" + reasons + ")");
}

}  // namespace

Status choose_backend(Backend requested, const Problem& problem, BackendImpl** chosen) {
  // The measured table is consulted only for auto on the GPU.
  const Backend first_gpu = requested == Backend::automatic && problem.device.kind == DeviceKind::cuda
                                ? preferred_gpu_backend(problem)
                                : Backend::cuda;
  return choose(requested, problem, "q", [&](const BackendImpl& impl) { return impl.supports(problem); }, first_gpu,
                chosen);
}

Status check_backend_placement(Backend requested, Device device, const char* first_tensor) {
  // choose() with every backend's kernels taken as able: what is left is placement.
  struct Placement {
    Device device;
  } placement{device};
  BackendImpl* chosen = nullptr;
  return choose(requested, placement, first_tensor, [](const BackendImpl&) { return Status::success(); },
                Backend::cuda, &chosen);
}

Status choose_linear_backend(Backend requested, const LinearProblem& problem, BackendImpl** chosen) {
  // No measured table yet: auto on the GPU tries cuda, then cudnn.
  return choose(requested, problem, "q", [&](const BackendImpl& impl) { return impl.supports_linear(problem); },
                Backend::cuda, chosen);
}

Status choose_merge_backend(Backend requested, const MergeProblem& problem, BackendImpl** chosen) {
  // Both GPU backends merge with the same kernel.
  return choose(requested, problem, "out_a", [&](const BackendImpl& impl) { return impl.supports_merge(problem); },
                Backend::cuda, chosen);
}

}  // namespace cuflash::detail
