// Host side of the KV-cache forward: what it supports, the split count,
// workspace, and the call: append, attention (split-KV), combine.
#include "sm80/flash_decode.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "empty_calls.hpp"
#include "sm80/combine_splits.hpp"
#include "sm80/flash_decode_tiles.hpp"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"
#include "sm80/kv_append.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_decode(const ForwardParams& p, int m_tiles, bool wide, cudaStream_t stream);
}  // namespace sm80

namespace {

constexpr int kElementBytes = 2;  // f16 / bf16
constexpr int kMaxGridYz = 65535;       // splits (<= kDecodeMaxSplits) and sequences
constexpr long long kMaxGridX = 2147483647;  // kv heads x row blocks

// The grid's shape before splitting: the CTA shape (per head or wide), CTAs
// per (sequence, kv heads), and how many CTAs the GPU holds at once (SMs x
// CTAs per SM by shared memory; 0 if unknown).
struct DecodeGrid {
  bool wide = false;
  int m_tiles = 1;
  int row_blocks = 1;
  int block_n = sm80::kDecodeBlockN;
  long long ctas = 0;
  int smem_bytes = 0;
  long long slots = 0;
};

// The grid of one CTA shape for `rows` query rows per kv head.
DecodeGrid grid_of_shape(const Problem& problem, const DeviceInfo& info, int rows, bool wide) {
  DecodeGrid grid;
  grid.wide = wide;
  const int kernel_dim = sm80::kernel_head_dim(problem.head_dim);
  grid.m_tiles = wide ? 1 : sm80::decode_m_tiles(kernel_dim, rows);
  grid.row_blocks = (rows + 16 * grid.m_tiles - 1) / (16 * grid.m_tiles);
  const sm80::DecodeShape shape = sm80::decode_shape(kernel_dim, wide);
  grid.block_n = shape.block_n;
  grid.ctas = static_cast<long long>(problem.batch) * (problem.heads_kv / shape.heads) * grid.row_blocks;
  grid.smem_bytes = sm80::decode_smem_bytes(kernel_dim, grid.m_tiles, kElementBytes, wide);
  if (info.valid && info.sm_count > 0) {
    const int per_sm = info.smem_per_sm > 0 ? std::clamp(info.smem_per_sm / (grid.smem_bytes + 1024), 1, 4) : 1;
    grid.slots = static_cast<long long>(info.sm_count) * per_sm;
  }
  return grid;
}

// The CTA shape asked for by CUFLASH_DECODE_CTA (`wide` or `per_head`, read
// on every call so that tests can run both); empty: the rule below. Either
// shape computes the same function.
std::string decode_cta_override() {
  const char* value = std::getenv("CUFLASH_DECODE_CTA");
  return value == nullptr ? std::string() : std::string(value);
}

// Whether the wide CTA (several kv heads, flash_decode_tiles.hpp) can run:
// its rows fit one m16 tile, its heads divide the kv heads, and each key's
// heads lie side by side in the cache (so that it reads them in one run) at
// the kernel's head dim (a narrower head dim runs per head).
bool wide_can_run(const Problem& problem, int rows) {
  if (sm80::kernel_head_dim(problem.head_dim) != problem.head_dim) return false;
  const int heads = sm80::decode_wide_heads(problem.head_dim);
  if (heads == 0 || rows > 16 || problem.heads_kv % heads != 0) return false;
  return problem.k.strides[2] == problem.head_dim && problem.v.strides[2] == problem.head_dim;
}

// The CTA shape: wide where it can run, its shared memory fits the GPU and,
// unless CUFLASH_DECODE_CTA says otherwise, its grid fills one or two waves
// of the GPU at least 90%, unsplit; else per head.
// Measured on an H100 (NOTES.md, decode round 4) against the per-head CTA:
// +1-2% at D=128 on such grids (B=128 32/8, B=64 32/32), +3.5-5.5% at D=64,
// +0.3-0.8% at D=256; but -1 to -30% where it would split (B <= 64 at 32/8:
// 8x fewer CTAs per sequence, so 8x the splits, each with the fixed cost of
// a CTA that holds a whole SM), -1% over four waves (B=128 32/32), and a
// grid of a few CTAs past a wave would leave most SMs idle in the last one.
// The shape depends on shapes and the device, never on the call's lengths
// or the cache's layout: paged and contiguous caches, and every call of a
// decode loop, take the same kernel.
DecodeGrid decode_grid(const Problem& problem) {
  const DeviceInfo& info = device_info(problem.device.index);
  const int rows = problem.group_size() * problem.max_q_len;
  if (wide_can_run(problem, rows)) {
    const DecodeGrid wide = grid_of_shape(problem, info, rows, true);
    if (info.valid && wide.smem_bytes <= info.max_smem_per_block) {
      const std::string forced = decode_cta_override();
      if (forced == "wide") return wide;
      if (forced != "per_head" && wide.slots > 0) {
        const long long waves = (wide.ctas + wide.slots - 1) / wide.slots;
        if (waves <= 2 && wide.ctas * 10 >= waves * wide.slots * 9) return wide;  // >= 90% of a wave: no split
      }
    }
  }
  return grid_of_shape(problem, info, rows, false);
}

// Key tiles one CTA may have to read for caches of up to kv_len keys: all of
// them, or, with a left window, the window plus the rows' own span.
long long visible_tiles(const Problem& problem, long long kv_len, int block_n) {
  long long keys = kv_len;
  if (problem.window_left >= 0)
    keys = std::min<long long>(keys, static_cast<long long>(problem.window_left) + problem.max_q_len +
                                         std::max(problem.window_right, 0) + 1);
  // +1: the visible keys need not start on a tile boundary.
  return (keys + block_n - 1) / block_n + 1;
}

// Split-KV when the grid would not fill the GPU (sm80::decode_splits): the
// (sequence, kv head, row block) CTAs get split into equal key ranges until
// there is about one CTA per slot (SMs x CTAs that fit an SM by shared
// memory). A grid that already fills 80% of the slots runs unsplit: the
// combine would cost more than the idle tail saves. Depends on shapes,
// `kv_len` and the device only.
int choose_splits(const Problem& problem, const DecodeGrid& grid, long long kv_len) {
  if (grid.slots <= 0) return 1;
  return sm80::decode_splits(grid.ctas, grid.slots, visible_tiles(problem, kv_len, grid.block_n));
}

template <typename T>
Status launch_for_dim(const ForwardParams& p, int head_dim, const DecodeGrid& grid, cudaStream_t stream) {
  return sm80::with_head_dim(
      head_dim,
      [&](auto d) { return sm80::launch_flash_decode<T, decltype(d)::value>(p, grid.m_tiles, grid.wide, stream); },
      [&] { return Status::unsupported("backend cuda: head_dim " + std::to_string(head_dim) + " has no decode kernel"); });
}

template <typename T>
Status append_and_decode(const Problem& problem, void* workspace, cudaStream_t stream) {
  ForwardParams p = make_forward_params(problem);
  CUFLASH_TRY(launch_kv_append<T>(p, stream));
  // No query row (q_len or heads_q 0) but k_new/v_new: the append is all there
  // is to do, and the decode grid would have no CTA.
  if (!has_query_rows(problem)) return {};
  const DecodeGrid grid = decode_grid(problem);
  place_split_partials(p, choose_splits(problem, grid, problem.max_kv_len), workspace);
  CUFLASH_TRY(launch_for_dim<T>(p, problem.head_dim, grid, stream));
  if (p.num_splits == 1) return {};
  return launch_combine_splits<T>(p, stream);
}

}  // namespace

Status flash_decode_supports(const Problem& problem) {
  const std::string prefix = "backend cuda forward (KV cache): ";
  if (problem.dtype != DType::f16 && problem.dtype != DType::bf16)
    return Status::unsupported(prefix + "the KV-cache kernels take f16 and bf16, got " + dtype_name(problem.dtype) +
                               " (backend cpu runs any dtype)");
  if (sm80::kernel_head_dim(problem.head_dim) == 0)
    return Status::unsupported(prefix + "head_dim " + std::to_string(problem.head_dim) +
                               " is not supported for f16/bf16 (supported: " + sm80::head_dim_rule() + ")");
  if (problem.paged && !cuda_page_size_supported(problem.page_size))
    return Status::unsupported(prefix + "page_size " + std::to_string(problem.page_size) + " is not " +
                               kCudaPageSizeRule + " (a key tile must not straddle two pages; backend cpu takes any)");
  if (problem.paged) {
    // The kernel forms a page's offset as int32 x int32 -> int64 and a slot's in 32 bits.
    const TensorView* caches[] = {&problem.k, &problem.v};
    for (const TensorView* cache : caches) {
      for (int dim = 0; dim < 2; ++dim) {
        if (cache->strides[dim] < 0 || cache->strides[dim] > std::numeric_limits<std::int32_t>::max())
          return Status::unsupported(prefix + (cache == &problem.k ? "k" : "v") + " stride " + std::to_string(dim) +
                                     " is " + std::to_string(cache->strides[dim]) +
                                     " elements; paged caches need page and slot strides in [0, 2^31)");
      }
    }
  }
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid) return Status::unsupported(prefix + "cannot query the GPU's properties");
  if (info.major < 8)
    return Status::unsupported(prefix + "needs compute capability 8.0 or newer (this GPU has " +
                               std::to_string(info.major) + "." + std::to_string(info.minor) + ")");
  const DecodeGrid grid = decode_grid(problem);
  if (grid.smem_bytes > info.max_smem_per_block)
    return Status::unsupported(prefix + "head_dim " + std::to_string(problem.head_dim) + " needs " +
                               std::to_string(grid.smem_bytes) + " bytes of shared memory per block, this GPU allows " +
                               std::to_string(info.max_smem_per_block));
  if (problem.batch > kMaxGridYz)
    return Status::unsupported(prefix + "batch " + std::to_string(problem.batch) + " exceeds " +
                               std::to_string(kMaxGridYz) + " (one grid row per sequence)");
  if (static_cast<long long>(problem.heads_kv) * grid.row_blocks > kMaxGridX)
    return Status::unsupported(prefix + "heads_kv x ceil(query heads per kv head x q_len / " +
                               std::to_string(16 * grid.m_tiles) + ") = " +
                               std::to_string(static_cast<long long>(problem.heads_kv) * grid.row_blocks) +
                               " exceeds " + std::to_string(kMaxGridX));
  CUFLASH_TRY(check_kernel_view(problem.q, "q"));
  CUFLASH_TRY(check_kernel_view(problem.k, "k"));
  CUFLASH_TRY(check_kernel_view(problem.v, "v"));
  if (!problem.out.empty()) CUFLASH_TRY(check_kernel_view(problem.out, "out"));
  if (problem.new_len > 0) {
    CUFLASH_TRY(check_kernel_view(problem.k_new, "kv_cache.k_new"));
    CUFLASH_TRY(check_kernel_view(problem.v_new, "kv_cache.v_new"));
  }
  return {};
}

std::size_t flash_decode_workspace_bytes(const Problem& problem) {
  if (!has_query_rows(problem)) return 0;  // an append alone (below)
  // choose_splits grows with kv_len, so the capacity's count bounds every call's.
  return split_partials_bytes(problem, choose_splits(problem, decode_grid(problem), problem.cache_capacity));
}

Status flash_decode(const Problem& problem, void* workspace, cudaStream_t stream) {
  if (problem.dtype == DType::bf16) return append_and_decode<__nv_bfloat16>(problem, workspace, stream);
  return append_and_decode<__half>(problem, workspace, stream);
}

}  // namespace cuflash::detail
