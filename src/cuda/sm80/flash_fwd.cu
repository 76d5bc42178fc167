// Host side of the FlashAttention forward: what it supports, which kernel
// runs (sm80 mma.sync, or wgmma on Hopper: sm90/flash_fwd_wgmma_kernel.cuh), how many
// key splits a small grid gets, parameters, dispatch on dtype x head dim; the
// split-KV partial results are combined by sm80/combine_splits.cu.
#include "sm80/flash_fwd.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "common/element_io.cuh"
#include "sm80/combine_splits.hpp"
#include "sm80/flash_fwd_tiles.hpp"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"
#include "sm90/flash_fwd_wgmma_tiles.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_fwd(const ForwardParams& p, cudaStream_t stream);
}  // namespace sm80
namespace sm90 {
template <typename T, int D>
Status launch_flash_fwd_wgmma(const ForwardParams& p, cudaStream_t stream);
}  // namespace sm90

namespace {

constexpr int kMaxSplits = 64;

// The kernel a problem runs on and its tile: the Hopper (wgmma) kernel on an
// sm_90 device when it was built and has the head dim, else the sm80 one.
// CUFLASH_SM90_FORWARD=0 in the environment keeps Hopper on the sm80 kernel
// (for comparing the two; both compute the same function).
struct ForwardKernel {
  bool wgmma = false;
  sm80::FwdTile tile{};
};

bool sm90_forward_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CUFLASH_SM90_FORWARD");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

ForwardKernel forward_kernel(const Problem& problem) {
  ForwardKernel k;
  k.tile = sm80::fwd_tile(problem.head_dim);
#if defined(CUFLASH_WITH_SM90A)
  const DeviceInfo& info = device_info(problem.device.index);
  const sm90::WgmmaFwdTile hopper = sm90::wgmma_fwd_tile(problem.head_dim);
  if (info.valid && info.major == 9 && info.minor == 0 && hopper.block_n > 0 && sm90_forward_enabled()) {
    k.wgmma = true;
    k.tile = {128, hopper.block_n, 8, false, hopper.min_blocks};
  }
#endif
  return k;
}

// Split-KV when the grid would leave SMs idle: few (batch x head x query
// block) CTAs over long keys. Each split keeps at least two key tiles.
// Depends on shapes and the device only, so workspace queries agree.
int choose_splits(const Problem& problem) {
  const sm80::FwdTile tile = forward_kernel(problem).tile;
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid || tile.block_m == 0) return 1;
  const long long m_blocks = (problem.max_q_len + tile.block_m - 1) / tile.block_m;
  const long long ctas = m_blocks * problem.heads_q * problem.batch;
  const long long key_tiles = (problem.max_kv_len + tile.block_n - 1) / tile.block_n;
  const long long slots = static_cast<long long>(info.sm_count) * tile.min_blocks;
  if (ctas * 2 > slots || key_tiles < 4) return 1;
  long long splits = (slots + ctas - 1) / ctas;
  splits = std::min<long long>({splits, key_tiles / 2, kMaxSplits});
  return static_cast<int>(std::max<long long>(splits, 1));
}

template <typename T>
Status launch_for_dim(const ForwardParams& p, int head_dim, bool wgmma, cudaStream_t stream) {
  return sm80::with_head_dim(
      head_dim,
      [&](auto d) {
        constexpr int D = decltype(d)::value;
        if constexpr (sm90::wgmma_fwd_tile(D).block_n > 0) {
          if (wgmma) return sm90::launch_flash_fwd_wgmma<T, D>(p, stream);
        }
        return sm80::launch_flash_fwd<T, D>(p, stream);
      },
      [&] { return Status::unsupported("backend cuda: head_dim " + std::to_string(head_dim) + " has no kernel"); });
}

template <typename T>
Status run_forward(ForwardParams& p, int head_dim, bool wgmma, cudaStream_t stream) {
  CUFLASH_TRY(launch_for_dim<T>(p, head_dim, wgmma, stream));
  if (p.num_splits == 1) return {};
  return launch_combine_splits<T>(p, stream);
}

}  // namespace

Status flash_forward_supports(const Problem& problem) {
  CUFLASH_TRY(sm80_attention_supports(problem, "forward"));
  if (!problem.out.empty()) CUFLASH_TRY(check_kernel_view(problem.out, "out"));
  return {};
}

std::size_t flash_forward_workspace_bytes(const Problem& problem) {
  return split_partials_bytes(problem, choose_splits(problem));
}

Status flash_forward(const Problem& problem, void* workspace, cudaStream_t stream) {
  ForwardParams p = make_forward_params(problem);
  const bool wgmma = forward_kernel(problem).wgmma;
  place_split_partials(p, choose_splits(problem), workspace);
  if (problem.dtype == DType::bf16) return run_forward<__nv_bfloat16>(p, problem.head_dim, wgmma, stream);
  return run_forward<__half>(p, problem.head_dim, wgmma, stream);
}

}  // namespace cuflash::detail
