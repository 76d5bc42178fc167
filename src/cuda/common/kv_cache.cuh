// Device-side addressing of a KV cache (KvCacheParams): a sequence's length
// and where its key j lives, contiguous or paged.
//
// Validation normally guarantees every index (seqlens_k within capacity,
// leftpad within seqlens_k, every block_table entry a sequence reads inside
// the cache). With
// check_index_contents off it reads none of them, so these helpers also keep
// bad indices from becoming out-of-bounds accesses: lengths are clamped into
// [0, capacity] and a page outside the cache reads as "no key" (its rows are
// zero-filled, its appends dropped). Results are then wrong, memory is safe.
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"

namespace cuflash::detail {

// Keys cached before the append, clamped to [0, capacity - new_len].
__device__ __forceinline__ int cache_cached_len(const KvCacheParams& c, int b) {
  const int cached = __ldg(c.seqlens_k + b);
  return max(0, min(cached, c.capacity - c.new_len));
}

// Keys sequence b attends to: cached plus appended.
__device__ __forceinline__ int cache_kv_len(const KvCacheParams& c, int b) {
  return cache_cached_len(c, b) + c.new_len;
}

// The cache row of sequence b's first key (flash-attn's cache_leftpad; 0
// without one), clamped to [0, cached]: its keys are rows
// [cache_first_key, cache_kv_len), the device side of Problem::kv_first.
__device__ __forceinline__ int cache_first_key(const KvCacheParams& c, int b) {
  if (c.leftpad == nullptr) return 0;
  return max(0, min(__ldg(c.leftpad + b), cache_cached_len(c, b)));
}

// Paged: sequence b's row of the block table.
__device__ __forceinline__ const std::int32_t* cache_pages(const KvCacheParams& c, int b) {
  return c.block_table + b * c.block_table_stride;
}

// Paged: whether a block-table entry names a page of the cache.
__device__ __forceinline__ bool cache_page_inside(const KvCacheParams& c, int page) {
  return page >= 0 && page < c.num_pages;
}

// Paged: which of a sequence's pages holds key j (its block-table column),
// and key j's slot in it (KvCacheParams).
__device__ __forceinline__ int cache_page_number(const KvCacheParams& c, int j) {
  return c.page_shift >= 0 ? j >> c.page_shift : j / c.page_size;
}
__device__ __forceinline__ int cache_slot_in_page(const KvCacheParams& c, int j) {
  return c.page_shift >= 0 ? j & ((1 << c.page_shift) - 1) : j % c.page_size;
}

// Paged: the page that holds key j, read from a sequence's block-table row,
// or -1 when the entry points outside the cache. j < capacity.
__device__ __forceinline__ int cache_page_in(const KvCacheParams& c, const std::int32_t* pages, int j) {
  const int page = __ldg(pages + cache_page_number(c, j));
  return cache_page_inside(c, page) ? page : -1;
}

// The page (contiguous: the batch row) that holds key j of sequence b, or -1
// when the block table points outside the cache. j < capacity.
__device__ __forceinline__ int cache_page(const KvCacheParams& c, int b, int j) {
  if (c.block_table == nullptr) return b;
  return cache_page_in(c, cache_pages(c, b), j);
}

__device__ __forceinline__ int cache_slot(const KvCacheParams& c, int j) {
  return c.block_table == nullptr ? j : cache_slot_in_page(c, j);
}

// Element offset of (page, slot, head hk) in a cache tensor with strides st.
__device__ __forceinline__ std::int64_t cache_offset(const RowStrides& st, int page, int slot, int hk) {
  return static_cast<std::int64_t>(page) * st.batch + static_cast<std::int64_t>(slot) * st.row +
         static_cast<std::int64_t>(hk) * st.head;
}

}  // namespace cuflash::detail
