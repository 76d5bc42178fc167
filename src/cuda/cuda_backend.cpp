// backend=cuda: cuflash's own kernels. fp16/bf16 run the FlashAttention-2
// tensor-core kernels (sm80/), f32 the plain-fp32 SIMT kernels (simt/); a KV
// cache (contiguous or paged, any q_len) runs the decode kernel
// (sm80/flash_decode*) after the append of k_new/v_new, forward only; a
// varlen forward with its keys in pages runs the varlen kernels on the keys
// packed first (common/paged_varlen.hpp).
#include <cuda_runtime_api.h>

#include <string>

#include "backend.hpp"
#include "common/attention_probs.hpp"
#include "common/attention_sinks.hpp"
#include "common/cuda_check.hpp"
#include "common/padded_head_dim.hpp"
#include "common/paged_varlen.hpp"
#include "common/scratch.hpp"
#include "common/varlen_tail.hpp"
#include "linear/linear_attention.hpp"
#include "simt/attention_f32.hpp"
#include "sm80/flash_decode.hpp"
#include "flash_backward.hpp"
#include "flash_forward.hpp"
#include "sm80/merge_states.cuh"

namespace cuflash::detail {

namespace {

class CudaBackend final : public BackendImpl {
 public:
  Backend kind() const override { return Backend::cuda; }

  bool available() const override {
    static const bool has_gpu = [] {
      int count = 0;
      return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
    }();
    return has_gpu;
  }

  Status supports(const Problem& problem) const override {
    if (problem.paged_varlen()) {
      CUFLASH_TRY(paged_varlen_supports(problem));
      return supports(packed_keys_problem(problem, nullptr));
    }
    CUFLASH_TRY(refuse_cpu_only_features(problem, "cuda", {.sinks = true,
                                                          .attn_probs = true,
                                                          .dropout = true,
                                                          .cache_leftpad = true,
                                                          .rotary = true}));
    if (problem.layout == Layout::kv_cache && !problem.attn_probs.empty())
      return Status::unsupported("attn_probs: backend cuda writes the debug probabilities of dense and varlen calls, "
                                 "not of a KV cache (backend cpu does)");
    if (problem.layout == Layout::kv_cache && problem.has_dropout())
      return Status::unsupported("dropout_p: backend cuda runs dropout in dense and varlen calls; its KV-cache "
                                 "kernels have none (backend cpu does)");
    if (problem.layout == Layout::kv_cache && problem.pass == Pass::backward)
      return Status::unsupported("backend cuda backward: KV-cache (paged or contiguous) backward is not implemented");
    if (needs_padded_head_dim(problem)) return kernels_support(padded_head_dim(problem, nullptr).problem);
    return kernels_support(problem);
  }
  Status supports_merge(const MergeProblem&) const override { return {}; }

  Status workspace_size(const Problem& problem, std::size_t* bytes) const override {
    CUFLASH_TRY(supports(problem));
    *bytes = required_bytes(problem);
    return {};
  }

  Status forward(const Problem& problem, const RunContext& context) override {
    return run(problem, context, [&](void* workspace, cudaStream_t stream) -> Status {
      if (!problem.paged_varlen()) return forward_steps(problem, workspace, stream);
      // The keys packed into the start of the workspace, then the varlen forward on them.
      const Problem packed = packed_keys_problem(problem, workspace);
      CUFLASH_TRY(gather_paged_keys(problem, packed, stream));
      return forward_steps(packed, static_cast<char*>(workspace) + packed_keys_bytes(problem), stream);
    });
  }
  Status backward(const Problem& problem, const RunContext& context) override {
    return run(problem, context, [&](void* workspace, cudaStream_t stream) -> Status {
      CUFLASH_TRY(with_padded_head_dim(problem, workspace, stream, backward_kernels));
      // dq, dk, dv need nothing more for sinks: the final out and lse hold them.
      CUFLASH_TRY(attention_sinks_backward(problem, static_cast<char*>(workspace) + align256(kernel_bytes(problem)), stream));
      if (problem.layout != Layout::varlen) return {};
      CUFLASH_TRY(zero_rows_after_sequences(problem.dq, problem.cu_seqlens_q.data, problem.batch, stream));
      CUFLASH_TRY(zero_rows_after_sequences(problem.dk, problem.cu_seqlens_k.data, problem.batch, stream));
      return zero_rows_after_sequences(problem.dv, problem.cu_seqlens_k.data, problem.batch, stream);
    });
  }

  Status merge_states(const MergeProblem& problem, const RunContext& context) override {
    DeviceGuard guard(problem.device.index);
    CUFLASH_TRY(guard.status());
    return launch_merge_states(problem, static_cast<cudaStream_t>(context.stream));
  }

  // Linear attention (linear/linear_attention.hpp): forward and decode step, backward.
  Status supports_linear(const LinearProblem& problem) const override { return linear_cuda_supports(problem); }
  Status linear_forward(const LinearProblem& problem, const RunContext& context) override {
    return run_linear(problem, context, linear_cuda_forward);
  }
  Status linear_backward(const LinearProblem& problem, const RunContext& context) override {
    return run_linear(problem, context, linear_cuda_backward);
  }

 private:
  // What the kernels of a problem (head dim padded if it needs to be) take.
  static Status kernels_support(const Problem& problem) {
    if (problem.layout == Layout::kv_cache) return flash_decode_supports(problem);
    if (problem.dtype == DType::f32) return f32_attention_supports(problem);
    return problem.pass == Pass::forward ? flash_forward_supports(problem) : flash_backward_supports(problem);
  }
  static Status forward_kernels(const Problem& problem, void* workspace, cudaStream_t stream) {
    if (problem.layout == Layout::kv_cache) return flash_decode(problem, workspace, stream);
    return problem.dtype == DType::f32 ? f32_forward(problem, workspace, stream)
                                       : flash_forward(problem, workspace, stream);
  }
  static Status backward_kernels(const Problem& problem, void* workspace, cudaStream_t stream) {
    return problem.dtype == DType::f32 ? f32_backward(problem, workspace, stream)
                                       : flash_backward(problem, workspace, stream);
  }
  // kernels(problem), or, for a head dim that is not a multiple of 8, kernels
  // on padded copies (common/padded_head_dim.hpp) placed first in the workspace.
  template <typename Kernels>
  static Status with_padded_head_dim(const Problem& problem, void* workspace, cudaStream_t stream, Kernels kernels) {
    if (!needs_padded_head_dim(problem)) return kernels(problem, workspace, stream);
    const PaddedHeadDim padded = padded_head_dim(problem, workspace);
    CUFLASH_TRY(pad_head_dim_inputs(problem, padded.problem, stream));
    CUFLASH_TRY(kernels(padded.problem, static_cast<char*>(workspace) + padded.bytes, stream));
    return unpad_head_dim_outputs(problem, padded.problem, stream);
  }

  static Status forward_steps(const Problem& problem, void* workspace, cudaStream_t stream) {
    if (!needs_lse_after_kernels(problem)) return with_padded_head_dim(problem, workspace, stream, forward_kernels);
    // The kernels run without the sinks, into the caller's lse or scratch;
    // the sinks then join each row's state (common/attention_sinks.hpp),
    // and the debug probabilities come from the final lse.
    Problem kernels_only = problem;
    if (problem.lse.empty())
      kernels_only.lse = scratch_lse_view(problem, static_cast<char*>(workspace) + align256(kernel_bytes(problem)));
    CUFLASH_TRY(with_padded_head_dim(kernels_only, workspace, stream, forward_kernels));
    CUFLASH_TRY(apply_attention_sinks(kernels_only, kernels_only.lse, stream));
    return write_attention_probs(problem, kernels_only.lse, stream);
  }

  // Forward steps after the kernels that read the lse: sinks, attn_probs.
  static bool needs_lse_after_kernels(const Problem& problem) {
    return problem.pass == Pass::forward && (problem.has_sinks || !problem.attn_probs.empty());
  }

  // The kernels' scratch, then a scratch lse (sinks, attn_probs) or dsinks'
  // partial sums; a paged varlen call's packed keys before all of them.
  static std::size_t required_bytes(const Problem& problem) {
    if (problem.paged_varlen())
      return packed_keys_bytes(problem) + required_bytes(packed_keys_problem(problem, nullptr));
    std::size_t after_kernels = 0;
    if (needs_lse_after_kernels(problem) && problem.lse.empty())
      after_kernels = align256(scratch_lse_view(problem, nullptr).numel() * sizeof(float));
    if (problem.pass == Pass::backward) after_kernels = attention_sinks_backward_bytes(problem);
    return after_kernels == 0 ? kernel_bytes(problem) : align256(kernel_bytes(problem)) + after_kernels;
  }
  static std::size_t kernel_bytes(const Problem& problem) {
    if (needs_padded_head_dim(problem)) {
      const PaddedHeadDim padded = padded_head_dim(problem, nullptr);
      return padded.bytes + kernel_bytes(padded.problem);
    }
    if (problem.layout == Layout::kv_cache) return flash_decode_workspace_bytes(problem);
    if (problem.pass == Pass::forward)
      return problem.dtype == DType::f32 ? f32_forward_workspace_bytes(problem) : flash_forward_workspace_bytes(problem);
    return problem.dtype == DType::f32 ? f32_backward_workspace_bytes(problem) : flash_backward_workspace_bytes(problem);
  }

  template <typename Kernels>
  Status run(const Problem& problem, const RunContext& context, Kernels kernels) {
    CUFLASH_TRY(supports(problem));
    return on_device_with_scratch(problem.device.index, required_bytes(problem), context, kernels);
  }

  template <typename Kernels>
  Status run_linear(const LinearProblem& problem, const RunContext& context, Kernels kernels) {
    CUFLASH_TRY(supports_linear(problem));
    return on_device_with_scratch(problem.device.index, linear_cuda_workspace_bytes(problem), context,
                                  [&](void* workspace, cudaStream_t stream) {
                                    return kernels(problem, workspace, stream);
                                  });
  }

  // A supported call's device made current and `bytes` of scratch acquired, then kernels(scratch, stream).
  template <typename Kernels>
  static Status on_device_with_scratch(int device, std::size_t bytes, const RunContext& context, Kernels kernels) {
    DeviceGuard guard(device);
    CUFLASH_TRY(guard.status());
    const auto stream = static_cast<cudaStream_t>(context.stream);
    Scratch scratch;
    CUFLASH_TRY(scratch.acquire(context, bytes, stream));
    return kernels(scratch.get(), stream);
  }
};

}  // namespace

BackendImpl* cuda_backend() {
  static CudaBackend backend;
  return &backend;
}

}  // namespace cuflash::detail
