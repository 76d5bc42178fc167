// Where a row of each tensor lives (element offsets through the view's
// strides) and dtype conversion of whole rows to and from float.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "cuflash/tensor.hpp"
#include "half_convert.hpp"
#include "problem.hpp"

namespace cuflash::detail::cpu {

// One element converted exactly to double (the float64 oracles read inputs this way).
inline double load_element_f64(const TensorView& view, std::int64_t offset) {
  switch (view.dtype) {
    case DType::f32: return static_cast<const float*>(view.data)[offset];
    case DType::f16: return f16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(view.data)[offset]);
    case DType::i32: return static_cast<const std::int32_t*>(view.data)[offset];
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// A head_dim-long row, converted to float: the rest of the backend only sees floats.
inline void load_row(const TensorView& view, std::int64_t offset, int length, float* dst) {
  switch (view.dtype) {
    case DType::f32: {
      std::memcpy(dst, static_cast<const float*>(view.data) + offset, sizeof(float) * length);
      return;
    }
    case DType::f16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(view.data) + offset;
      for (int d = 0; d < length; ++d) dst[d] = f16_to_float(src[d]);
      return;
    }
    case DType::bf16: {
      const std::uint16_t* src = static_cast<const std::uint16_t*>(view.data) + offset;
      for (int d = 0; d < length; ++d) dst[d] = bf16_to_float(src[d]);
      return;
    }
    case DType::i32:
      break;
  }
}

inline void store_row(const TensorView& view, std::int64_t offset, int length, const float* src) {
  switch (view.dtype) {
    case DType::f32: {
      std::memcpy(static_cast<float*>(view.data) + offset, src, sizeof(float) * length);
      return;
    }
    case DType::f16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(view.data) + offset;
      for (int d = 0; d < length; ++d) dst[d] = float_to_f16(src[d]);
      return;
    }
    case DType::bf16: {
      std::uint16_t* dst = static_cast<std::uint16_t*>(view.data) + offset;
      for (int d = 0; d < length; ++d) dst[d] = float_to_bf16(src[d]);
      return;
    }
    case DType::i32:
      break;
  }
}

// `value` rounded to `dtype` (round to nearest even) and back: what storing
// it in a tensor of that dtype keeps.
inline float round_to(DType dtype, float value) {
  switch (dtype) {
    case DType::f16: return f16_to_float(float_to_f16(value));
    case DType::bf16: return bf16_to_float(float_to_bf16(value));
    case DType::f32:
    case DType::i32: break;
  }
  return value;
}

inline void store_zero_row(const TensorView& view, std::int64_t offset, int length) {
  std::memset(static_cast<char*>(view.data) + offset * static_cast<std::int64_t>(dtype_size(view.dtype)), 0,
              dtype_size(view.dtype) * length);
}

// Same-dtype row copy (the KV-cache append): no conversion, so bits are kept.
inline void copy_row(const TensorView& src, std::int64_t src_offset, const TensorView& dst,
                     std::int64_t dst_offset, int length) {
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(src.dtype));
  std::memcpy(static_cast<char*>(dst.data) + dst_offset * element,
              static_cast<const char*>(src.data) + src_offset * element, element * length);
}

inline float load_f32(const TensorView& view, std::int64_t offset) {
  return static_cast<const float*>(view.data)[offset];
}

inline void store_f32(const TensorView& view, std::int64_t offset, float value) {
  static_cast<float*>(view.data)[offset] = value;
}

// Row addressing for one validated Problem: query-side tensors (q, out, dout,
// dq), key-side tensors (k, v, dk, dv, in whichever layout) and lse.
class RowAddress {
 public:
  explicit RowAddress(const Problem& problem) : problem_(problem) {}

  // q-like view: dense and KV cache [B, q_len, H, D]; varlen [total_q, H, D].
  std::int64_t query(const TensorView& view, int batch_index, int row, int head) const {
    if (problem_.layout == Layout::varlen) {
      const std::int64_t packed_row = problem_.host_cu_seqlens_q[batch_index] + static_cast<std::int64_t>(row);
      return packed_row * view.strides[0] + head * view.strides[1];
    }
    return batch_index * view.strides[0] + static_cast<std::int64_t>(row) * view.strides[1] + head * view.strides[2];
  }

  // lse: dense and KV cache [B, Hq, q_len]; varlen [Hq, total_q].
  std::int64_t lse(const TensorView& view, int batch_index, int row, int head) const {
    if (problem_.layout == Layout::varlen) {
      const std::int64_t packed_row = problem_.host_cu_seqlens_q[batch_index] + static_cast<std::int64_t>(row);
      return head * view.strides[0] + packed_row * view.strides[1];
    }
    return batch_index * view.strides[0] + head * view.strides[1] + static_cast<std::int64_t>(row) * view.strides[2];
  }

  // Key `key` of sequence `batch_index` in a k-like view (for a KV cache, and
  // a varlen call's keys in pages: the cache, at cache position `key`).
  std::int64_t key(const TensorView& view, int batch_index, int key, int head_kv) const {
    switch (problem_.layout) {
      case Layout::varlen: {
        if (problem_.paged) return cache_row(view, cache_slot(batch_index, key), head_kv);
        const std::int64_t packed_row = problem_.host_cu_seqlens_k[batch_index] + static_cast<std::int64_t>(key);
        return packed_row * view.strides[0] + head_kv * view.strides[1];
      }
      case Layout::kv_cache:
        return cache_row(view, cache_slot(batch_index, key), head_kv);
      case Layout::dense:
        break;
    }
    return batch_index * view.strides[0] + static_cast<std::int64_t>(key) * view.strides[1] +
           head_kv * view.strides[2];
  }

  // KV cache (and paged varlen keys): the physical slot (page * page_size +
  // position in page) holding cache position `position` of sequence
  // `batch_index`. A contiguous cache is addressed the same way with one
  // "page" of `capacity` slots per sequence.
  std::int64_t cache_slot(int batch_index, int position) const {
    const int page_size = problem_.page_size;
    if (!problem_.paged) return static_cast<std::int64_t>(batch_index) * page_size + position;
    const std::int64_t table_index = static_cast<std::int64_t>(batch_index) * problem_.max_pages + position / page_size;
    const std::int64_t page = problem_.host_block_table[table_index];
    return page * page_size + position % page_size;
  }

  // Total physical slots of the cache, over all pages (or all cache sequences).
  std::int64_t cache_slot_count() const {
    return static_cast<std::int64_t>(problem_.num_pages) * problem_.page_size;
  }

  std::int64_t cache_row(const TensorView& view, std::int64_t slot, int head_kv) const {
    const std::int64_t page = slot / problem_.page_size;
    const std::int64_t in_page = slot % problem_.page_size;
    return page * view.strides[0] + in_page * view.strides[1] + head_kv * view.strides[2];
  }

  // k_new / v_new [B, new_len, Hk, D].
  std::int64_t appended(const TensorView& view, int batch_index, int row, int head_kv) const {
    return batch_index * view.strides[0] + static_cast<std::int64_t>(row) * view.strides[1] +
           head_kv * view.strides[2];
  }

 private:
  const Problem& problem_;
};

// Keys [first_key, first_key + count) of (sequence, kv head) from a k-like
// view, as rows of row_length floats (head_dim of data, the rest left as is);
// positions that are no key of the sequence (before kv_first or at or past
// kv_len: Problem::kv_first, kv_len) become zero rows, so padded tiles stay
// finite whatever those cache rows hold.
inline void load_key_rows(const RowAddress& address, const TensorView& view, int batch_index, int head_kv,
                          int first_key, int count, int kv_first, int kv_len, int head_dim, int row_length,
                          float* rows) {
  for (int j = 0; j < count; ++j) {
    float* row = rows + static_cast<std::int64_t>(j) * row_length;
    const int key = first_key + j;
    if (key >= kv_first && key < kv_len) load_row(view, address.key(view, batch_index, key, head_kv), head_dim, row);
    else std::fill_n(row, head_dim, 0.0f);
  }
}

// The same keys (count a multiple of tile_width) as transposed tiles: key j's
// element d at tiles[(j / tile_width) * row_length * tile_width + d * tile_width + j % tile_width],
// so that a score loop over the keys of a tile reads contiguous memory.
inline void load_key_tiles_transposed(const RowAddress& address, const TensorView& view, int batch_index,
                                      int head_kv, int first_key, int count, int kv_first, int kv_len, int head_dim,
                                      int row_length, int tile_width, float* row_scratch, float* tiles) {
  for (int j = 0; j < count; ++j) {
    const int key = first_key + j;
    if (key >= kv_first && key < kv_len)
      load_row(view, address.key(view, batch_index, key, head_kv), head_dim, row_scratch);
    else std::fill_n(row_scratch, head_dim, 0.0f);
    float* tile = tiles + static_cast<std::int64_t>(j / tile_width) * row_length * tile_width + j % tile_width;
    for (int d = 0; d < head_dim; ++d) tile[d * tile_width] = row_scratch[d];
  }
}

}  // namespace cuflash::detail::cpu
