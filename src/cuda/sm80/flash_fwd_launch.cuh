// Launch of the forward kernel for one (element type, head dim); explicitly
// instantiated once per pair in src/cuda/inst/ so the build parallelizes.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm80/flash_fwd_kernel.cuh"
#include "sm80/flash_fwd_tiles.hpp"

namespace cuflash::detail::sm80 {

template <typename T, int D>
Status launch_flash_fwd(const ForwardParams& p, cudaStream_t stream) {
  constexpr FwdTile tile = fwd_tile(D);
  using C = FwdConfig<T, D, tile.block_m, tile.block_n, tile.warps, tile.q_in_regs, tile.min_blocks>;
  const bool transformed = transformed_scores(p);
  auto kernel = p.has_dropout        ? flash_fwd_kernel<C, true, true>
                : transformed        ? flash_fwd_kernel<C, true>
                : p.head_dim < C::D  ? flash_fwd_kernel<C, false, false, true>
                                     : flash_fwd_kernel<C, false>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, C::kSmemBytes, "flash_fwd_kernel"));
  const dim3 grid((p.max_q_len + C::BM - 1) / C::BM, p.heads_q, p.batch * p.num_splits);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, ForwardBlockDivisors::of(p));
  return launch_status("flash_fwd_kernel");
}

}  // namespace cuflash::detail::sm80
