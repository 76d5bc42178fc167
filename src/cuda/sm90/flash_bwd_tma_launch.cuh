// Launch of the warp-specialized TMA backward for one (element type, head
// dim); explicitly instantiated once per pair in src/cuda/inst/. Order on
// the stream: preparation (lse2, dsum, the dQ accumulator zeroed), the main
// kernel (dK, dV; dQ added into the accumulator), the dq conversion. Head
// dims above 128 take the wide kernel (the consumers split the columns).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "sm90/flash_bwd_tma_kernel.cuh"
#include "sm90/flash_bwd_tma_wide_kernel.cuh"
#include "sm90/flash_bwd_tma_launch_args.hpp"
#include "sm90/tma_map.hpp"

namespace cuflash::detail::sm90 {

// Head dims whose dK and dV do not fit one consumer's registers (64 keys x
// D x 2 accumulators) take the wide kernel: its config and its kernel.
constexpr bool tma_bwd_wide(int d) { return d > 128; }

template <class C, bool Transformed>
constexpr auto tma_bwd_main_kernel() {
  if constexpr (tma_bwd_wide(C::D))
    return flash_bwd_tma_wide_kernel<C, Transformed>;
  else
    return flash_bwd_tma_kernel<C, Transformed>;
}

template <typename T, int D>
Status launch_flash_bwd_tma(const BackwardParams& p, const TmaBackwardLaunch& launch, void* workspace,
                            cudaStream_t stream) {
  using C = std::conditional_t<tma_bwd_wide(D), TmaBwdWideConfig<T, D>, TmaBwdConfig<T, D>>;
  TmaBackwardParams tp;
  tp.p = p;
  // The tensors the plan checked (backward_plan.cpp) are the ones encoded.
  CUFLASH_TRY(encode_head_rows_map(&tp.q, launch.q, C::BM, "q"));
  CUFLASH_TRY(encode_head_rows_map(&tp.dout, launch.dout, C::BM, "dout"));
  CUFLASH_TRY(encode_head_rows_map(&tp.k, launch.k, C::BN, "k"));
  CUFLASH_TRY(encode_head_rows_map(&tp.v, launch.v, C::BN, "v"));
  const TmaBackwardWorkspace ws = tma_backward_workspace(p.total_q_rows, p.batch, p.heads_q, D, p.deterministic);
  auto* base = static_cast<unsigned char*>(workspace);
  tp.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
  tp.lse2 = reinterpret_cast<float*>(base + ws.lse2);
  tp.dsum = reinterpret_cast<float*>(base + ws.dsum);
  if (p.deterministic) tp.dq_turn = reinterpret_cast<std::uint32_t*>(base + ws.dq_turn);
  tp.chain_interleave = launch.chain_interleave;
  tp.padded_rows = bwd_padded_rows(p.total_q_rows, p.batch);

  const dim3 row_tiles(static_cast<unsigned>((p.max_q_len + kBwdTileRows - 1) / kBwdTileRows),
                       static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  if (p.max_q_len > 0) {
    flash_bwd_tma_prep_kernel<T, D><<<row_tiles, 256, 0, stream>>>(tp);
    CUFLASH_TRY(launch_status("flash_bwd_tma_prep_kernel"));
  }
  if (p.max_kv_len > 0) {
    auto kernel = transformed_scores(p) ? tma_bwd_main_kernel<C, true>() : tma_bwd_main_kernel<C, false>();
    CUFLASH_TRY(allow_dynamic_smem(kernel, C::kSmemBytes, "flash_bwd_tma_kernel"));
    const dim3 grid(static_cast<unsigned>((p.max_kv_len + C::BN - 1) / C::BN), static_cast<unsigned>(p.heads_kv),
                    static_cast<unsigned>(p.batch));
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(tp);
    CUFLASH_TRY(launch_status("flash_bwd_tma_kernel"));
  }
  if (p.max_q_len > 0) {
    flash_bwd_tma_convert_kernel<C><<<row_tiles, 256, 0, stream>>>(tp);
    CUFLASH_TRY(launch_status("flash_bwd_tma_convert_kernel"));
  }
  return {};
}

}  // namespace cuflash::detail::sm90
