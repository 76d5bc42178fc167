// Launch of the warp-specialized TMA forward for one (element type, head
// dim); explicitly instantiated once per pair in src/cuda/inst/.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm90/flash_fwd_tma_kernel.cuh"
#include "sm90/flash_fwd_tma_launch_args.hpp"
#include "sm90/flash_fwd_wgmma_tiles.hpp"
#include "sm90/tma_map.hpp"

namespace cuflash::detail::sm90 {

template <class C, bool Transformed>
Status launch_tma_config(const ForwardParams& p, const TmaForwardLaunch& launch, cudaStream_t stream) {
  TmaForwardParams tp;
  tp.p = p;
  // The tensors the plan checked (forward_plan.cpp) are the ones encoded.
  CUFLASH_TRY(encode_head_rows_map(&tp.q, launch.q, C::BM, "q"));
  CUFLASH_TRY(encode_head_rows_map(&tp.k, launch.k, C::BN, "k"));
  CUFLASH_TRY(encode_head_rows_map(&tp.v, launch.v, C::BN, "v"));
  // Each consumer warpgroup stores its own 64 rows.
  tp.out_by_tma = launch.out_by_tma;
  if (tp.out_by_tma) CUFLASH_TRY(encode_head_rows_map(&tp.out, launch.out, 64, "out"));
  const int m_blocks = (p.max_q_len + C::BM - 1) / C::BM;
  const int items = m_blocks * p.heads_q * p.batch * p.num_splits;
  const int ctas = launch.persistent_ctas > 0 ? std::min(items, launch.persistent_ctas) : items;
  tp.divisors = ForwardBlockDivisors::of(p);
  tp.order = TileOrder::make(m_blocks, p.heads_q, items, launch.causal_walk && ctas < items, ctas);
  auto kernel = flash_fwd_tma_kernel<C, Transformed>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, C::kSmemBytes, "flash_fwd_tma_kernel"));
  kernel<<<ctas, C::kThreads, C::kSmemBytes, stream>>>(tp);
  CUFLASH_TIMELINE_DUMP(stream, C::D, C::Consumers, C::Stages, ctas, tp.order.items);
  return launch_status("flash_fwd_tma_kernel");
}

// D: the kernel head dim; DC: the columns computed (tma_columns).
template <typename T, int D, int DC>
Status launch_flash_fwd_tma(const ForwardParams& p, const TmaForwardLaunch& launch, cudaStream_t stream) {
  constexpr TmaFwdTile tile = tma_fwd_tile(D);
  static_assert(tile.block_n > 0, "no TMA forward for this head dim");
  using C = TmaFwdConfig<T, D, tile.block_n, tile.consumers, tile.stages, DC>;
  // Transformed scores (softcap, ALiBi, a scale <= 0: transformed_scores)
  // need more registers than three consumer warpgroups have (160 each: 460
  // bytes of spills at D = 64); they take two.
  using CT = TmaFwdConfig<T, D, tile.block_n, tile.consumers == 3 ? 2 : tile.consumers, tile.stages, DC>;
  if (transformed_scores(p)) return launch_tma_config<CT, true>(p, launch, stream);
  if constexpr (tile.split_keys_max_keys > 0 && DC == D) {
    using CK = TmaFwdConfigSplitKeys<T, D, split_keys_block_n(tile), split_keys_stages(tile), DC>;
    if (launch.split_keys) return launch_tma_config<CK, false>(p, launch, stream);
  }
  if constexpr (tile.few_items_consumers > 0 && DC == D) {
    static_assert(tile.few_items_consumers == CT::Consumers, "few_items_consumers: the two-consumer config");
    if (launch.few_items) return launch_tma_config<CT, false>(p, launch, stream);
  }
  if constexpr (tile.short_block_n > 0 && DC == D) {
    using CS = TmaFwdConfig<T, D, tile.short_block_n, tile.consumers, tile.stages, DC>;
    if (launch.short_tiles) return launch_tma_config<CS, false>(p, launch, stream);
  }
  if constexpr (tile.short_q_buffers > 0 && DC == D) {
    using CQ = TmaFwdConfigQ<T, D, tile.block_n, tile.consumers, tile.stages, tile.short_q_buffers, DC>;
    static_assert(CQ::QBuffers == tile.short_q_buffers, "short_q_buffers: they must fit in shared memory");
    if (launch.short_q_buffers) return launch_tma_config<CQ, false>(p, launch, stream);
  }
  if constexpr (tile.deep_stages > 0 && DC == D) {
    using CD = TmaFwdConfig<T, D, tile.block_n, tile.consumers, tile.deep_stages, DC>;
    if (launch.deep_ring) return launch_tma_config<CD, false>(p, launch, stream);
  }
  return launch_tma_config<C, false>(p, launch, stream);
}

}  // namespace cuflash::detail::sm90
