// The interface every backend implements. Backends receive only validated
// Problems; `supports` says, with a reason, which valid problems they cannot run.
#pragma once

#include <string>

#include "cuflash/options.hpp"
#include "cuflash/status.hpp"
#include "linear_problem.hpp"
#include "problem.hpp"

namespace cuflash::detail {

class BackendImpl {
 public:
  virtual ~BackendImpl() = default;
  virtual Backend kind() const = 0;
  // Compiled in and usable on this machine now.
  virtual bool available() const = 0;
  // ok, or `unsupported` naming what it cannot do; never touches memory.
  virtual Status supports(const Problem& problem) const = 0;
  virtual Status supports_merge(const MergeProblem& problem) const = 0;
  virtual Status workspace_size(const Problem& problem, std::size_t* bytes) const = 0;
  virtual Status forward(const Problem& problem, const RunContext& context) = 0;
  virtual Status backward(const Problem& problem, const RunContext& context) = 0;
  virtual Status merge_states(const MergeProblem& problem, const RunContext& context) = 0;

  // Linear attention (linear_problem.hpp), a sibling op: linear_forward runs
  // the forward and the decode step (LinearPass::step), linear_backward the
  // backward. A backend without its kernels
  // keeps these defaults, which refuse it by name, so that auto never picks it.
  virtual Status supports_linear(const LinearProblem& problem) const {
    return Status::unsupported(std::string("linear attention: backend ") + backend_name(kind()) +
                               " has no linear-attention kernels yet (backends cpu and cuda have them)");
  }
  virtual Status linear_forward(const LinearProblem& problem, const RunContext& context) {
    return supports_linear(problem);
  }
  virtual Status linear_backward(const LinearProblem& problem, const RunContext& context) {
    return supports_linear(problem);
  }
};

// What of the features backend cpu has a GPU backend runs too.
struct GpuFeatures {
  bool sinks = false;
  bool attn_probs = false;
  bool dropout = false;
  bool cache_leftpad = false;  // kv_cache.leftpad
  bool rotary = false;         // kv_cache.rotary_cos/rotary_sin
};

// The features only backend cpu has so far on some GPU backend (attention
// sinks, the debug probabilities, dropout, a KV cache's leftpad and rotary
// embedding on cudnn): `unsupported`, naming the feature and
// `backend`, when the problem uses one that `runs` does not list. GPU
// backends call it first in supports(), so that auto never picks them for
// such a call and nothing falls back silently.
inline Status refuse_cpu_only_features(const Problem& problem, const char* backend, GpuFeatures runs = {}) {
  const std::string name = std::string("backend ") + backend;
  if (problem.has_sinks && !runs.sinks)
    return Status::unsupported("sinks: " + name + " has no attention sinks yet (backends cpu and cuda have them)");
  if (problem.has_dropout() && !runs.dropout)
    return Status::unsupported("dropout_p: " + name + " has no dropout with cuflash's mask (backends cpu and cuda "
                               "have it)");
  if (!problem.attn_probs.empty() && !runs.attn_probs)
    return Status::unsupported("attn_probs: " + name + " does not write the debug probabilities (backends cpu and "
                               "cuda do)");
  if (problem.has_leftpad && !runs.cache_leftpad)
    return Status::unsupported("kv_cache.leftpad (cache_leftpad): " + name + " has no left-padded KV caches "
                               "(backends cpu and cuda have them)");
  if (problem.rotary_dim > 0 && !runs.rotary)
    return Status::unsupported("kv_cache.rotary_cos/rotary_sin: " + name + " has no rotary embedding (backends cpu "
                               "and cuda have it)");
  return {};
}

// One instance per kind, owned by the library; nullptr when not compiled in.
BackendImpl* cpu_backend();
BackendImpl* cuda_backend();
BackendImpl* cudnn_backend();

}  // namespace cuflash::detail
