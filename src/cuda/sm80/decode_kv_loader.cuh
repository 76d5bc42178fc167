// The decode kernel's K/V loader: a CTA's key tiles of its C::NH kv heads,
// from a contiguous or paged cache into the kernel's cp.async stages (each
// head's rows of a tile in turn, K then V).
//
// Decode moves every cache byte once; the loader issues 16-byte copies with
// little integer work between them (NOTES.md, decode rounds 2 and 3):
//  - a thread keeps one 16-byte column of the keys r0, r0 + kRowStep, ...,
//    a column of one of the CTA's heads; its address is formed once per CTA;
//  - a tile is addressed per page, not per row: the rows of a thread that
//    share a page differ by a pointer step. A contiguous cache is one page
//    per sequence. Paged caches take this path when a page holds at least
//    kRowStep rows (so that a thread's rows of a page are consecutive in its
//    loop); smaller pages take the per-row path;
//  - the block-table entries of a tile are read one tile ahead, one lane per
//    page, and handed to the lanes that need them by a shuffle, so no warp
//    waits on a block-table load before issuing its copies.
// A tile that reaches past the sequence's keys (or starts before them: a
// leftpad), or with a block-table entry outside the cache (only possible with
// check_index_contents off), is loaded per row with every row checked: such
// rows are zero-filled, never read.
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/kv_cache.cuh"
#include "common/tensor_core.cuh"
#include "sm80/head_dims.hpp"

namespace cuflash::detail::sm80 {

template <class C>
class DecodeKvLoader {
  using T = typename C::Element;
  static constexpr int kHeadChunks = C::D / 8;               // 16-byte chunks of one head's row
  static constexpr int kChunksPerKey = C::NH * kHeadChunks;  // ... of the CTA's heads' rows of one key
  // A thread per 16-byte column of kRowStep keys at a time (every head dim
  // but 96 and 192, whose rows of 12 and 24 chunks do not divide the CTA).
  static constexpr bool kByColumn = C::kThreads % kChunksPerKey == 0 && C::BN % (C::kThreads / kChunksPerKey) == 0;
  static constexpr int kRowStep = kByColumn ? C::kThreads / kChunksPerKey : 1;
  static constexpr int kRows = kByColumn ? C::BN / kRowStep : 0;  // a thread's keys of a tile

  // 16-byte chunk `idx` of a tile (key-major, then head, then column), and
  // where it goes in a stage's K (or V) half: head h's rows follow head h - 1's.
  struct Chunk {
    int key, head, col;  // key of the tile, head-local kv head, 16-byte column of the head's row
    __device__ __forceinline__ int smem_offset() const { return C::Rows::offset(head * C::BN + key, col); }
  };
  static __device__ __forceinline__ Chunk chunk(int idx) {
    return {idx / kChunksPerKey, idx % kChunksPerKey / kHeadChunks, idx % kHeadChunks};
  }

 public:
  __device__ __forceinline__ DecodeKvLoader(const ForwardParams& p, int b, int hk0) : p_(p), b_(b), hk0_(hk0) {
    if constexpr (kByColumn) {
      const KvCacheParams& cache = p.cache;
      const Chunk own = chunk(threadIdx.x);  // this thread's column, at its first key
      const int col = chunk_to_read(own.col, p.head_dim);  // sm80/head_dims.hpp: why a clamp, not a predicate
      std::int64_t k_col = (hk0 + own.head) * p.k_strides.head + col * 8 + own.key * p.k_strides.row;
      std::int64_t v_col = (hk0 + own.head) * p.v_strides.head + col * 8 + own.key * p.v_strides.row;
      if (cache.block_table == nullptr) {
        // One page per sequence, its rows at any offset: the tile's first key
        // is its slot.
        k_col += b * p.k_strides.batch;
        v_col += b * p.v_strides.batch;
        its_per_page_ = kRows;
      } else {
        const int page_size = cache.page_size;
        pages_ = cache_pages(cache, b);
        // Keys of a tile per page (a page larger than the tile: the tile is
        // in one page, at slot n0 mod page_size).
        page_keys_ = page_size < C::BN ? page_size : C::BN;
        its_per_page_ = page_keys_ >= kRowStep ? page_keys_ / kRowStep : 0;
        // flash_decode_supports keeps paged strides below 2^31 elements.
        k_page_bytes_ = static_cast<std::uint32_t>(p.k_strides.batch) * sizeof(T);
        v_page_bytes_ = static_cast<std::uint32_t>(p.v_strides.batch) * sizeof(T);
      }
      k_col_ = reinterpret_cast<const char*>(static_cast<const T*>(p.k) + k_col);
      v_col_ = reinterpret_cast<const char*>(static_cast<const T*>(p.v) + v_col);
      k_slot_bytes_ = p.k_strides.row * static_cast<std::int64_t>(sizeof(T));
      v_slot_bytes_ = p.v_strides.row * static_cast<std::int64_t>(sizeof(T));
    }
  }

  // Call before the first load: starts reading tile `first`'s block-table entries.
  __device__ __forceinline__ void start(int first) {
    if (reads_ahead()) next_page_ = lane_entry(first);
  }

  // K and V rows [tile * BN, tile * BN + BN) into one stage; rows outside the
  // sequence's keys [k_first, k_len) (a leftpad's rows, and past the end) are
  // zero-filled. Tiles are loaded in increasing order from `first`.
  __device__ __forceinline__ void load(T* sK, T* sV, int tile, int k_first, int k_len) {
    const int n0 = tile * C::BN;
    if constexpr (kByColumn) {
      if (its_per_page_ > 0) {
        // Paged: this tile's entries were read during the previous load; read the next tile's.
        int page = 0;
        if (reads_ahead()) {
          page = next_page_;
          next_page_ = lane_entry(tile + 1);
        }
        if (n0 >= k_first && n0 + C::BN <= k_len) {
          if (pages_ == nullptr) {
            issue<kRows, false>(sK, sV, n0, 0);
            return;
          }
          // Checked only now, so that no warp waited on the entries' load;
          // lanes past the tile's pages do not count.
          const int lane = threadIdx.x % 32;
          if (__all_sync(0xffffffffu, cache_page_inside(p_.cache, page) || lane * page_keys_ >= C::BN)) {
            issue_paged<kRows>(sK, sV, n0, page);
            return;
          }
        }
      }
    }
    load_rows(sK, sV, n0, k_first, k_len);
  }

 private:
  // Paged, page at a time: block-table entries are read a tile ahead.
  __device__ __forceinline__ bool reads_ahead() const { return pages_ != nullptr && its_per_page_ > 0; }

  // Lane l's block-table entry for the l-th page of `tile`, unchecked (-1:
  // no such page in the tile, or past the cache's capacity).
  __device__ __forceinline__ int lane_entry(int tile) const {
    const int lane = threadIdx.x % 32;
    const int j = tile * C::BN + lane * page_keys_;
    if (lane * page_keys_ >= C::BN || j >= p_.cache.capacity) return -1;
    return __ldg(pages_ + cache_page_number(p_.cache, j));
  }

  // The largest pages first: kIts rows of a thread per page.
  template <int kIts>
  __device__ __forceinline__ void issue_paged(T* sK, T* sV, int n0, int page) {
    if constexpr (kIts > 1) {
      if (its_per_page_ != kIts) {
        issue_paged<kIts / 2>(sK, sV, n0, page);
        return;
      }
    }
    issue<kIts, true>(sK, sV, n0, page);
  }

  // A whole tile, every row valid: per page, one address and then a pointer
  // step per row. Page q of the tile is lane q's `page` (paged).
  template <int kIts, bool kPaged>
  __device__ __forceinline__ void issue(T* sK, T* sV, int n0, int page) {
    const Chunk own = chunk(threadIdx.x);
    // The tile's first key's slot (kv_cache.cuh; paged with pages < BN: 0).
    const std::int64_t slot = cache_slot(p_.cache, n0);
    const char* k_tile = k_col_ + slot * k_slot_bytes_;
    const char* v_tile = v_col_ + slot * v_slot_bytes_;
    const std::int64_t k_step = kRowStep * k_slot_bytes_, v_step = kRowStep * v_slot_bytes_;
#pragma unroll
    for (int q = 0; q < kRows / kIts; ++q) {
      const char* k_row = k_tile;
      const char* v_row = v_tile;
      if constexpr (kPaged) {
        const std::uint32_t at_page = static_cast<std::uint32_t>(__shfl_sync(0xffffffffu, page, q));
        k_row += static_cast<std::uint64_t>(at_page) * k_page_bytes_;
        v_row += static_cast<std::uint64_t>(at_page) * v_page_bytes_;
      }
#pragma unroll
      for (int i = 0; i < kIts; ++i) {
        const int at = Chunk{own.key + (q * kIts + i) * kRowStep, own.head, own.col}.smem_offset();
        cp_async_16(sK + at, k_row);
        cp_async_16(sV + at, v_row);
        k_row += k_step;
        v_row += v_step;
      }
    }
  }

  // Any tile, row by row: each row's page looked up and checked against
  // [k_first, k_len) and the cache.
  __device__ __forceinline__ void load_rows(T* sK, T* sV, int n0, int k_first, int k_len) const {
    const T* k = static_cast<const T*>(p_.k);
    const T* v = static_cast<const T*>(p_.v);
#pragma unroll
    for (int idx = threadIdx.x; idx < C::BN * kChunksPerKey; idx += C::kThreads) {
      const Chunk x = chunk(idx);
      const int j = n0 + x.key;
      const int page = j >= k_first && j < k_len ? cache_page(p_.cache, b_, j) : -1;
      const bool valid = page >= 0;
      const int slot = cache_slot(p_.cache, j);
      const int col = chunk_to_read(x.col, p_.head_dim);
      const T* k_src = valid ? k + cache_offset(p_.k_strides, page, slot, hk0_ + x.head) + col * 8 : k;
      const T* v_src = valid ? v + cache_offset(p_.v_strides, page, slot, hk0_ + x.head) + col * 8 : v;
      const int at = x.smem_offset();
      cp_async_16(sK + at, k_src, valid);
      cp_async_16(sV + at, v_src, valid);
    }
  }

  const ForwardParams& p_;
  const int b_, hk0_;  // sequence, first kv head
  const char* k_col_ = nullptr;  // this thread's column of its first row (contiguous: of sequence b)
  const char* v_col_ = nullptr;
  std::int64_t k_slot_bytes_ = 0, v_slot_bytes_ = 0;   // from one row (slot) to the next
  std::uint32_t k_page_bytes_ = 0, v_page_bytes_ = 0;  // from one page to the next (paged)
  const std::int32_t* pages_ = nullptr;                // sequence b's block-table row (paged)
  int page_keys_ = C::BN;  // keys of a tile per page
  int its_per_page_ = 0;   // a thread's rows per page in a tile; 0: per-row loads only
  int next_page_ = -1;     // lane l: the next tile's l-th block-table entry
};

}  // namespace cuflash::detail::sm80
