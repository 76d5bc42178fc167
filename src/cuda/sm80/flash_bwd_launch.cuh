// Launch of the backward kernels for one (element type, head dim); explicitly
// instantiated once per pair in src/cuda/inst/flash_bwd_*.cu so the build
// parallelizes. Order on the stream: [zero dq_accum], dsum, dK/dV (+ dQ
// atomics), then either the dq conversion or the deterministic dQ kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm80/flash_bwd_kernel.cuh"

namespace cuflash::detail::sm80 {

// Shared-memory buffers (1 or 2) that fit `limit` bytes for a kernel whose
// footprint is bytes(stages); 0 when neither does.
template <typename Bytes>
int flash_bwd_stages(Bytes bytes, int limit) {
  if (bytes(2) <= static_cast<std::size_t>(limit)) return 2;
  if (bytes(1) <= static_cast<std::size_t>(limit)) return 1;
  return 0;
}

template <typename T, int D>
Status launch_flash_backward(const BackwardParams& p, int max_smem_per_block, cudaStream_t stream) {
  using Tr = FlashBwdTraits<D>;
  const int main_stages = flash_bwd_stages([](int s) { return Tr::main_smem_bytes(s); }, max_smem_per_block);
  const int dq_stages = flash_bwd_stages([](int s) { return Tr::dq_smem_bytes(s); }, max_smem_per_block);
  if (main_stages == 0 || (p.deterministic && dq_stages == 0)) {
    const std::size_t needed = main_stages == 0 ? Tr::main_smem_bytes(1) : Tr::dq_smem_bytes(1);
    return Status::unsupported("backend cuda backward: head_dim " + std::to_string(D) + " needs " +
                               std::to_string(needed) + " bytes of shared memory per block; this GPU allows " +
                               std::to_string(max_smem_per_block));
  }

  const std::int64_t q_rows = p.total_q_rows;
  if (q_rows > 0) {  // dsum, and dq_accum zeroed unless deterministic
    using Shape = DsumShape<D>;
    const std::int64_t slots_per_cta = static_cast<std::int64_t>(Shape::kWarps) * Shape::kSlotsPerWarp;
    const std::int64_t ctas = (q_rows * p.heads_q + slots_per_cta - 1) / slots_per_cta;
    flash_bwd_dsum_kernel<T, D><<<static_cast<unsigned>(ctas), Shape::kWarps * 32, 0, stream>>>(p);
    CUFLASH_TRY(launch_status("flash_bwd_dsum_kernel"));
  }

  if (p.max_kv_len > 0) {
    auto kernel = p.has_dropout ? flash_bwd_dkdv_kernel<T, D, true> : flash_bwd_dkdv_kernel<T, D, false>;
    const std::size_t smem = Tr::main_smem_bytes(main_stages);
    CUFLASH_TRY(allow_dynamic_smem(kernel, smem, "flash_bwd_dkdv_kernel"));
    const dim3 grid(static_cast<unsigned>((p.max_kv_len + Tr::BN - 1) / Tr::BN), static_cast<unsigned>(p.heads_kv),
                    static_cast<unsigned>(p.batch));
    kernel<<<grid, Tr::kThreads, smem, stream>>>(p, main_stages);
    CUFLASH_TRY(launch_status("flash_bwd_dkdv_kernel"));
  }

  if (p.max_q_len == 0 || q_rows == 0) return {};
  if (p.deterministic) {
    auto kernel = p.has_dropout ? flash_bwd_dq_kernel<T, D, true> : flash_bwd_dq_kernel<T, D, false>;
    const std::size_t smem = Tr::dq_smem_bytes(dq_stages);
    CUFLASH_TRY(allow_dynamic_smem(kernel, smem, "flash_bwd_dq_kernel"));
    const dim3 grid(static_cast<unsigned>((p.max_q_len + Tr::BM - 1) / Tr::BM), static_cast<unsigned>(p.heads_q),
                    static_cast<unsigned>(p.batch));
    kernel<<<grid, Tr::kThreads, smem, stream>>>(p, dq_stages);
    return launch_status("flash_bwd_dq_kernel");
  }
  const std::int64_t chunks = q_rows * p.heads_q * (D / 8);
  flash_bwd_convert_dq_kernel<T, D><<<static_cast<unsigned>((chunks + 255) / 256), 256, 0, stream>>>(p);
  return launch_status("flash_bwd_convert_dq_kernel");
}

}  // namespace cuflash::detail::sm80
