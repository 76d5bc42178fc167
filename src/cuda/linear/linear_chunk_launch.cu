// The chunked tensor-core path of linear attention: which problems it takes,
// its plan and workspace, and the forward: causal, the fused kernel
// (linear_chunk_fused.cuh); non-causal (or under CUFLASH_LINEAR_FORWARD=walk),
// the walk of the states, then the output pass (linear_chunk_state.cuh,
// linear_chunk_pass.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "linear/linear_chunk_launch.cuh"
#include "linear/linear_chunk_launch.hpp"

namespace cuflash::detail {

namespace {

using linear::ChunkWorkspace;
using linear::LinearParams;
using linear::Pass;

bool aligned16(const TensorView& view) {
  if (reinterpret_cast<std::uintptr_t>(view.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < view.rank; ++d)
    if (view.strides[d] % 8 != 0) return false;
  return true;
}

// CUFLASH_LINEAR_KERNEL=simt keeps every linear-attention call on the SIMT
// recurrence (linear_simt.cuh), so that tests and benchmarks can hold the
// tensor-core kernels against it; read on every call.
bool simt_forced() {
  const char* value = std::getenv("CUFLASH_LINEAR_KERNEL");
  return value != nullptr && std::strcmp(value, "simt") == 0;
}

// CUFLASH_LINEAR_FORWARD=walk keeps the causal forward on the walk and the
// output pass (the non-causal forward's path), so that tests and benchmarks
// can hold the fused kernel against it; read on every call.
bool walk_forward_forced() {
  const char* value = std::getenv("CUFLASH_LINEAR_FORWARD");
  return value != nullptr && std::strcmp(value, "walk") == 0;
}

}  // namespace

bool linear_chunk_supports(const LinearProblem& p) {
  if (p.pass == LinearPass::step || simt_forced()) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if ((p.key_dim != 64 && p.key_dim != 128) || (p.value_dim != 64 && p.value_dim != 128)) return false;
  if (p.heads_kv > 65535) return false;
  const bool backward = p.pass == LinearPass::backward;
  for (const TensorView* view : {&p.q, &p.k, &p.v, backward ? &p.dout : &p.out})
    if (!aligned16(*view)) return false;
  if (backward)
    for (const TensorView* view : {&p.dq, &p.dk, &p.dv})
      if (!aligned16(*view)) return false;
  return true;
}

namespace linear {

ChunkPlan chunk_plan(const LinearProblem& p) {
  ChunkPlan plan;
  plan.fused_forward = p.pass == LinearPass::forward && p.causal && !walk_forward_forced();
  plan.segments = plan.fused_forward ? fused_forward_segments(p.batch, p.heads_kv, p.value_dim, p.max_len)
                                     : walk_segments(p.batch, p.heads_kv, p.key_dim, p.value_dim, p.max_len);
  return plan;
}

}  // namespace linear

std::size_t linear_chunk_workspace_bytes(const LinearProblem& p) {
  return linear::chunk_workspace_bytes(linear::chunk_plan(p), p);
}

Status linear_chunk_forward(const LinearProblem& problem, const LinearParams& params, void* workspace,
                            cudaStream_t stream) {
  const linear::ChunkPlan plan = linear::chunk_plan(problem);
  const ChunkWorkspace w = linear::chunk_workspace(plan, problem, workspace);
  return linear::for_half_dtype(problem.dtype, [&](auto tag) {
    using T = decltype(tag);
    if (plan.fused_forward) return linear::launch_fused_forward<T>(params, w, plan.segments, stream);
    CUFLASH_TRY(linear::launch_states<T>(params, w, stream));
    return linear::launch_pass<T, Pass::output>(params, w, stream);
  });
}

}  // namespace cuflash::detail
