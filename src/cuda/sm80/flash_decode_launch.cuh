// Launch of the decode kernel for one (element type, head dim); explicitly
// instantiated once per pair in src/cuda/inst/ so the build parallelizes.
#pragma once

#include <cuda_runtime_api.h>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm80/flash_decode_kernel.cuh"
#include "sm80/flash_decode_tiles.hpp"

namespace cuflash::detail::sm80 {

template <typename T, int D, int MT, bool Wide>
Status launch_flash_decode_rows(const ForwardParams& p, cudaStream_t stream) {
  using C = DecodeConfig<T, D, MT, Wide>;
  const bool transformed = transformed_scores(p);
  auto kernel = transformed ? flash_decode_kernel<C, true> : flash_decode_kernel<C, false>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, C::kSmemBytes, "flash_decode_kernel"));
  const int rows = p.group * p.max_q_len;
  const int row_blocks = (rows + C::BM - 1) / C::BM;
  const dim3 grid(p.heads_kv / C::NH * row_blocks, p.num_splits, p.batch);
  kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(p);
  return launch_status("flash_decode_kernel");
}

// m_tiles: decode_m_tiles(D, group * q_len), and wide: the CTA shape
// (flash_decode_tiles.hpp), both as the host chose them for the split count.
template <typename T, int D>
Status launch_flash_decode(const ForwardParams& p, int m_tiles, bool wide, cudaStream_t stream) {
  if constexpr (decode_wide_heads(D) > 0) {
    if (wide) return launch_flash_decode_rows<T, D, 1, true>(p, stream);
  }
  if constexpr (decode_tile(D).max_m_tiles >= 2) {
    if (m_tiles == 2) return launch_flash_decode_rows<T, D, 2, false>(p, stream);
  }
  return launch_flash_decode_rows<T, D, 1, false>(p, stream);
}

}  // namespace cuflash::detail::sm80
