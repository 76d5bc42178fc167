// Host side of the KV-cache forward: what it supports, the split count,
// workspace, and the call: append, attention (split-KV), combine.
#include "sm80/flash_decode.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/device_info.hpp"
#include "sm80/combine_splits.hpp"
#include "sm80/flash_decode_tiles.hpp"
#include "sm80/head_dims.hpp"
#include "sm80/kernel_support.hpp"
#include "sm80/kv_append.hpp"

namespace cuflash::detail {

namespace sm80 {
template <typename T, int D>
Status launch_flash_decode(const ForwardParams& p, int m_tiles, cudaStream_t stream);
}  // namespace sm80

namespace {

constexpr int kElementBytes = 2;  // f16 / bf16
constexpr int kMaxGridYz = 65535;       // splits (<= 64) and sequences
constexpr long long kMaxGridX = 2147483647;  // kv heads x row blocks

// The grid's shape before splitting: CTAs per (sequence, kv head), and how
// many of them one SM holds (shared memory is what limits them).
struct DecodeGrid {
  int m_tiles = 1;
  int row_blocks = 1;
  long long ctas = 0;
  int smem_bytes = 0;
};

DecodeGrid decode_grid(const Problem& problem) {
  DecodeGrid grid;
  const int rows = problem.group_size() * problem.max_q_len;
  grid.m_tiles = sm80::decode_m_tiles(problem.head_dim, rows);
  grid.row_blocks = (rows + 16 * grid.m_tiles - 1) / (16 * grid.m_tiles);
  grid.ctas = static_cast<long long>(problem.batch) * problem.heads_kv * grid.row_blocks;
  grid.smem_bytes = sm80::decode_smem_bytes(problem.head_dim, grid.m_tiles, kElementBytes);
  return grid;
}

// Key tiles one CTA may have to read for caches of up to kv_len keys: all of
// them, or, with a left window, the window plus the rows' own span.
long long visible_tiles(const Problem& problem, long long kv_len) {
  long long keys = kv_len;
  if (problem.window_left >= 0)
    keys = std::min<long long>(keys, static_cast<long long>(problem.window_left) + problem.max_q_len +
                                         std::max(problem.window_right, 0) + 1);
  // +1: the visible keys need not start on a tile boundary.
  return (keys + sm80::kDecodeBlockN - 1) / sm80::kDecodeBlockN + 1;
}

// Split-KV when the grid would not fill the GPU (sm80::decode_splits): the
// (sequence, kv head, row block) CTAs get split into equal key ranges until
// there is about one CTA per slot (SMs x CTAs that fit an SM by shared
// memory). A grid that already fills 80% of the slots runs unsplit: the
// combine would cost more than the idle tail saves. Depends on shapes,
// `kv_len` and the device only.
int choose_splits(const Problem& problem, long long kv_len) {
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid || info.sm_count <= 0) return 1;
  const DecodeGrid grid = decode_grid(problem);
  const int per_sm = info.smem_per_sm > 0 ? std::clamp(info.smem_per_sm / (grid.smem_bytes + 1024), 1, 4) : 1;
  const long long slots = static_cast<long long>(info.sm_count) * per_sm;
  return sm80::decode_splits(grid.ctas, slots, visible_tiles(problem, kv_len));
}

template <typename T>
Status launch_for_dim(const ForwardParams& p, int head_dim, int m_tiles, cudaStream_t stream) {
  return sm80::with_head_dim(
      head_dim, [&](auto d) { return sm80::launch_flash_decode<T, decltype(d)::value>(p, m_tiles, stream); },
      [&] { return Status::unsupported("backend cuda: head_dim " + std::to_string(head_dim) + " has no decode kernel"); });
}

template <typename T>
Status run_decode(const ForwardParams& p, int head_dim, int m_tiles, cudaStream_t stream) {
  CUFLASH_TRY(launch_for_dim<T>(p, head_dim, m_tiles, stream));
  if (p.num_splits == 1) return {};
  return launch_combine_splits<T>(p, stream);
}

}  // namespace

Status flash_decode_supports(const Problem& problem) {
  const std::string prefix = "backend cuda forward (KV cache): ";
  if (problem.dtype != DType::f16 && problem.dtype != DType::bf16)
    return Status::unsupported(prefix + "the KV-cache kernels take f16 and bf16, got " + dtype_name(problem.dtype) +
                               " (backend cpu runs any dtype)");
  bool dim_ok = false;
  for (int d : sm80::kHeadDims) dim_ok = dim_ok || d == problem.head_dim;
  if (!dim_ok)
    return Status::unsupported(prefix + "head_dim " + std::to_string(problem.head_dim) +
                               " is not supported for f16/bf16 (supported: 32, 64, 96, 128, 192, 256)");
  if (problem.paged && (problem.page_size & (problem.page_size - 1)) != 0)
    return Status::unsupported(prefix + "page_size " + std::to_string(problem.page_size) +
                               " is not a power of two (the kernels find a key's page and slot by shift and mask)");
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

int flash_decode_splits(const Problem& problem) { return choose_splits(problem, problem.max_kv_len); }

std::size_t flash_decode_workspace_bytes(const Problem& problem) {
  // choose_splits grows with kv_len, so the capacity's count bounds every call's.
  return split_partials_bytes(problem, choose_splits(problem, problem.cache_capacity));
}

Status flash_decode(const Problem& problem, void* workspace, cudaStream_t stream) {
  ForwardParams p = make_forward_params(problem);
  CUFLASH_TRY(launch_kv_append(p, kElementBytes, stream));
  place_split_partials(p, flash_decode_splits(problem), workspace);
  const int m_tiles = decode_grid(problem).m_tiles;
  if (problem.dtype == DType::bf16) return run_decode<__nv_bfloat16>(p, problem.head_dim, m_tiles, stream);
  return run_decode<__half>(p, problem.head_dim, m_tiles, stream);
}

}  // namespace cuflash::detail
