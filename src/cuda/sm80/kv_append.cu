#include "sm80/kv_append.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/kv_cache.cuh"
#include "common/rotary_chunk.cuh"

namespace cuflash::detail {

namespace {

// One thread per 16-byte chunk of a (sequence, new row, kv head) row, for K
// and V together (they share the target slot). Reads of k_new and writes to
// the cache are both whole 16-byte vectors; consecutive threads take
// consecutive chunks of a row, so each row is one or two full sectors. With a
// rotary embedding a thread reads the other columns its K chunk's pairs need
// (rotary_chunk.cuh) and writes the chunk rotated.
template <typename T>
__global__ void kv_append_kernel(const AttentionParams p, int chunks_per_row) {
  const KvCacheParams& c = p.cache;
  const bool rotate = c.rotary.cos != nullptr;
  const std::int64_t total =
      static_cast<std::int64_t>(p.batch) * c.new_len * p.heads_kv * chunks_per_row;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int chunk = static_cast<int>(idx % chunks_per_row);
    std::int64_t rest = idx / chunks_per_row;
    const int hk = static_cast<int>(rest % p.heads_kv);
    rest /= p.heads_kv;
    const int n = static_cast<int>(rest % c.new_len);
    const int b = static_cast<int>(rest / c.new_len);
    const int cached = cache_cached_len(c, b);
    const int j = cached + n;  // < capacity: the length is clamped for the append
    const int page = cache_page(c, b, j);
    if (page < 0) continue;  // only with check_index_contents off: a bad entry drops the row
    const int slot = cache_slot(c, j);
    const std::int64_t new_row = static_cast<std::int64_t>(b) * c.k_new_strides.batch +
                                 static_cast<std::int64_t>(n) * c.k_new_strides.row +
                                 static_cast<std::int64_t>(hk) * c.k_new_strides.head;
    const std::int64_t new_row_v = static_cast<std::int64_t>(b) * c.v_new_strides.batch +
                                   static_cast<std::int64_t>(n) * c.v_new_strides.row +
                                   static_cast<std::int64_t>(hk) * c.v_new_strides.head;
    // The cache is the call's in/out tensor when new_len > 0 (validation made
    // sure it overlaps no input), hence the const_cast of AttentionParams::k/v.
    T* k = static_cast<T*>(const_cast<void*>(p.k)) + cache_offset(p.k_strides, page, slot, hk);
    T* v = static_cast<T*>(const_cast<void*>(p.v)) + cache_offset(p.v_strides, page, slot, hk);
    const T* k_src = static_cast<const T*>(c.k_new) + new_row;
    const T* v_src = static_cast<const T*>(c.v_new) + new_row_v;
    reinterpret_cast<uint4*>(k)[chunk] = rotate
                                             ? rotated_chunk(k_src, chunk, rotary_key_position(cached, n), c.rotary)
                                             : reinterpret_cast<const uint4*>(k_src)[chunk];
    reinterpret_cast<uint4*>(v)[chunk] = reinterpret_cast<const uint4*>(v_src)[chunk];
  }
}

}  // namespace

template <typename T>
Status launch_kv_append(const AttentionParams& p, cudaStream_t stream) {
  if (p.cache.new_len == 0) return {};
  const int chunks_per_row = p.head_dim * static_cast<int>(sizeof(T)) / 16;
  const std::int64_t total = static_cast<std::int64_t>(p.batch) * p.cache.new_len * p.heads_kv * chunks_per_row;
  constexpr int kThreads = 256;
  // Enough blocks to cover a decode step's rows in one pass; a long prefill
  // chunk loops (grid-stride) rather than launching millions of blocks.
  const std::int64_t blocks = std::min<std::int64_t>((total + kThreads - 1) / kThreads, 8192);
  kv_append_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p, chunks_per_row);
  return launch_status("kv_append_kernel");
}

template Status launch_kv_append<__half>(const AttentionParams&, cudaStream_t);
template Status launch_kv_append<__nv_bfloat16>(const AttentionParams&, cudaStream_t);

}  // namespace cuflash::detail
