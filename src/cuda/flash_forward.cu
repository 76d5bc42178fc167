// Host side of the FlashAttention forward: what it supports, and the launch
// of the kernel the plan (forward_plan.hpp: sm80 mma.sync, or wgmma / TMA on
// Hopper, the split count) picked, dispatched on dtype x head dim; the
// split-KV partial results are combined by sm80/combine_splits.cu.
#include "flash_forward.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/kernel_table.hpp"
#include "forward_plan.hpp"
#include "sm80/combine_splits.hpp"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"
#include "sm90/flash_fwd_tma_launch_args.hpp"
#include "sm90/flash_fwd_wgmma_tiles.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_fwd(const ForwardParams& p, cudaStream_t stream);
}  // namespace sm80
namespace sm90 {
template <typename T, int D>
Status launch_flash_fwd_wgmma(const ForwardParams& p, cudaStream_t stream);
template <typename T, int D, int DC>
Status launch_flash_fwd_tma(const ForwardParams& p, const TmaForwardLaunch& launch, cudaStream_t stream);
}  // namespace sm90

namespace {

template <typename T>
Status launch_for_dim(const ForwardParams& p, const Problem& problem, const ForwardPlan& plan, cudaStream_t stream) {
  const ForwardKind kind = plan.kind;
  if (kind == ForwardKind::tma) {
    const sm90::TmaForwardLaunch& launch = plan.tma;
    // (kernel head dim, columns computed): sm90::tma_columns.
    return kernel_table::with_tma_columns(
        sm90::tma_columns(problem.head_dim),
        [&](auto d, auto columns) {
          return sm90::launch_flash_fwd_tma<T, decltype(d)::value, decltype(columns)::value>(p, launch, stream);
        },
        [&] {
          return Status(StatusCode::internal,
                        "backend cuda: no TMA kernel for head_dim " + std::to_string(problem.head_dim));
        });
  }
  return sm80::with_head_dim(
      problem.head_dim,
      [&](auto d) {
        constexpr int D = decltype(d)::value;
        if constexpr (sm90::wgmma_fwd_tile(D).block_n > 0) {
          if (kind == ForwardKind::wgmma) return sm90::launch_flash_fwd_wgmma<T, D>(p, stream);
        }
        return sm80::launch_flash_fwd<T, D>(p, stream);
      },
      [&] {
        return Status::unsupported("backend cuda: head_dim " + std::to_string(problem.head_dim) + " has no kernel");
      });
}

template <typename T>
Status run_forward(ForwardParams& p, const Problem& problem, const ForwardPlan& plan, cudaStream_t stream) {
  CUFLASH_TRY(launch_for_dim<T>(p, problem, plan, stream));
  if (p.num_splits == 1) return {};
  return launch_combine_splits<T>(p, stream);
}

}  // namespace

Status flash_forward_supports(const Problem& problem) {
  CUFLASH_TRY(sm80_attention_supports(problem, "forward"));
  if (!problem.out.empty()) CUFLASH_TRY(check_kernel_view(problem.out, "out"));
  return {};
}

std::size_t flash_forward_workspace_bytes(const Problem& problem) { return plan_forward(problem).workspace_bytes; }

Status flash_forward(const Problem& problem, void* workspace, cudaStream_t stream) {
  ForwardParams p = make_forward_params(problem);
  // One plan per call: the split partials are placed as the workspace query sized them.
  const ForwardPlan plan = plan_forward(problem);
  place_split_partials(p, plan.splits, workspace);
  if (problem.dtype == DType::bf16) return run_forward<__nv_bfloat16>(p, problem, plan, stream);
  return run_forward<__half>(p, problem, plan, stream);
}

}  // namespace cuflash::detail
