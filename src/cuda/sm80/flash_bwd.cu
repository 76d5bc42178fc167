// Host side of the sm80 backward kernels: what they support, their
// workspace, and dispatch on dtype x head dim to the explicit instantiations
// in src/cuda/inst/flash_bwd_*.cu (flash_backward.cu decides when they run).
#include "sm80/flash_bwd.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/scratch.hpp"
#include "sm80/flash_bwd_kernel.cuh"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_backward(const BackwardParams& p, int max_smem_per_block, cudaStream_t stream);
}  // namespace sm80

namespace {

// Query rows of dq_accum and dsum: dense batch * max_q_len, varlen every packed
// row; dq_accum rows are the kernel's head dim wide (sm80/head_dims.hpp).
std::size_t dq_accum_bytes(const Problem& problem) {
  return align256(static_cast<std::size_t>(total_q_rows(problem)) * problem.heads_q *
                  sm80::kernel_head_dim(problem.head_dim) * sizeof(float));
}

// Shared memory the kernels need with single buffering (the least they run with).
template <int D>
std::size_t min_smem_bytes(bool deterministic) {
  using Tr = sm80::FlashBwdTraits<D>;
  const std::size_t main = Tr::main_smem_bytes(1);
  return deterministic && Tr::dq_smem_bytes(1) > main ? Tr::dq_smem_bytes(1) : main;
}

std::size_t min_smem_bytes(int head_dim, bool deterministic) {
  return sm80::with_head_dim(
      head_dim, [&](auto d) { return min_smem_bytes<decltype(d)::value>(deterministic); },
      [] { return std::size_t{0}; });
}

template <typename T>
Status launch_for_dim(const BackwardParams& p, int head_dim, int max_smem, cudaStream_t stream) {
  return sm80::with_head_dim(
      head_dim, [&](auto d) { return sm80::launch_flash_backward<T, decltype(d)::value>(p, max_smem, stream); },
      [&] { return Status::unsupported("backend cuda backward: head_dim " + std::to_string(head_dim) + " has no kernel"); });
}

}  // namespace

Status sm80_backward_supports(const Problem& problem) {
  if (problem.layout == Layout::kv_cache)
    return Status::unsupported("backend cuda backward: paged/KV-cache backward is not implemented by backend cuda");
  CUFLASH_TRY(sm80_attention_supports(problem, "backward"));
  CUFLASH_TRY(check_kernel_view(problem.out, "out"));
  CUFLASH_TRY(check_kernel_view(problem.dout, "dout"));
  CUFLASH_TRY(check_kernel_view(problem.dq, "dq"));
  CUFLASH_TRY(check_kernel_view(problem.dk, "dk"));
  CUFLASH_TRY(check_kernel_view(problem.dv, "dv"));
  const std::size_t smem = min_smem_bytes(problem.head_dim, problem.deterministic);
  const int smem_limit = device_info(problem.device.index).max_smem_per_block;
  if (smem > static_cast<std::size_t>(smem_limit))
    return Status::unsupported("backend cuda backward: head_dim " + std::to_string(problem.head_dim) + " needs " +
                               std::to_string(smem) + " bytes of shared memory per block; this GPU allows " +
                               std::to_string(smem_limit));
  if (problem.batch > 65535 || problem.heads_q > 65535)
    return Status::unsupported("backend cuda backward: batch and heads_q must be at most 65535 (grid limits), got " +
                               std::to_string(problem.batch) + " and " + std::to_string(problem.heads_q));
  return {};
}

std::size_t sm80_backward_workspace_bytes(const Problem& problem) {
  const std::size_t dsum = align256(static_cast<std::size_t>(total_q_rows(problem)) * problem.heads_q * sizeof(float));
  return dq_accum_bytes(problem) + dsum;
}

Status sm80_backward(const Problem& problem, BackwardParams p, const DeviceInfo& info, void* workspace,
                     cudaStream_t stream) {
  auto* base = static_cast<unsigned char*>(workspace);
  p.dq_accum = reinterpret_cast<float*>(base);
  p.dsum = reinterpret_cast<float*>(base + dq_accum_bytes(problem));

  if (problem.dtype == DType::bf16) return launch_for_dim<__nv_bfloat16>(p, problem.head_dim, info.max_smem_per_block, stream);
  if (problem.dtype == DType::f16) return launch_for_dim<__half>(p, problem.head_dim, info.max_smem_per_block, stream);
  return Status::unsupported("backend cuda backward: the tensor-core kernels take f16 and bf16");
}

}  // namespace cuflash::detail
