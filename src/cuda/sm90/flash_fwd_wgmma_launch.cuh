// Launch of the Hopper forward kernel for one (element type, head dim);
// explicitly instantiated once per pair in src/cuda/inst/.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm90/flash_fwd_wgmma_kernel.cuh"
#include "sm90/flash_fwd_wgmma_tiles.hpp"

namespace cuflash::detail::sm90 {

template <typename T, int D>
Status launch_flash_fwd_wgmma(const ForwardParams& p, cudaStream_t stream) {
  constexpr WgmmaFwdTile tile = wgmma_fwd_tile(D);
  static_assert(tile.block_n > 0, "no Hopper forward for this head dim");
  using C = WgmmaFwdConfig<T, D, tile.block_n, tile.stages, tile.min_blocks>;
  const bool transformed = transformed_scores(p);
  auto kernel = transformed ? flash_fwd_wgmma_kernel<C, true> : flash_fwd_wgmma_kernel<C, false>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, C::kSmemBytes, "flash_fwd_wgmma_kernel"));
  const dim3 grid((p.max_q_len + C::BM - 1) / C::BM, p.heads_q, p.batch * p.num_splits);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, ForwardBlockDivisors::of(p));
  return launch_status("flash_fwd_wgmma_kernel");
}

}  // namespace cuflash::detail::sm90
