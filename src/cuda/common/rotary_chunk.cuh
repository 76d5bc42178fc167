// The rotary embedding of a KV-cache forward (the rule: src/core/rotary.hpp)
// on the device, 16 bytes at a time: the append and the decode kernel's Q
// load move rows of k_new and q as 16-byte chunks of 8 elements, and a
// rotated element needs its pair's other element, which lies in the same
// chunk (GPT-J: column c ^ 1), in the chunk rotary_dim / 16 away (GPT-NeoX
// with rotary_dim a multiple of 16, flash-attn's only case), or, for other
// GPT-NeoX widths, anywhere in the row (read element by element).
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"
#include "common/element_io.cuh"
#include "rotary.hpp"

namespace cuflash::detail {

// Chunk `chunk` (elements 8 chunk .. 8 chunk + 7) of a row of T in global
// memory (16-byte aligned), rotated at row `position` of cos/sin and rounded
// once to T; chunks past rotary_dim come back as they are.
template <typename T>
__device__ __forceinline__ uint4 rotated_chunk(const T* row, int chunk, int position, const RotaryParams& r) {
  const int first_column = chunk * 8;
  const uint4 own = *reinterpret_cast<const uint4*>(row + first_column);
  if (first_column >= r.dim) return own;
  const int half = r.dim / 2;
  // GPT-NeoX with whole chunks per half: the partners are one chunk, column for column.
  const bool partner_chunk_aligned = !r.interleaved && half % 8 == 0;
  uint4 partners = own;
  if (partner_chunk_aligned)
    partners = *reinterpret_cast<const uint4*>(row + (first_column < half ? first_column + half : first_column - half));
  const T* own_values = reinterpret_cast<const T*>(&own);
  const T* partner_values = reinterpret_cast<const T*>(&partners);
  const T* cos = static_cast<const T*>(r.cos) + position * r.cos_row_stride;
  const T* sin = static_cast<const T*>(r.sin) + position * r.sin_row_stride;
  uint4 result = own;
  T* out = reinterpret_cast<T*>(&result);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int column = first_column + e;
    if (column >= r.dim) continue;
    const int pair_index = rotary_pair_index(column, r.dim, r.interleaved);
    const RotaryPair pair = rotary_pair(pair_index, r.dim, r.interleaved);
    const bool first = column == pair.first;
    float partner;
    if (r.interleaved) partner = load_float(&own_values[e ^ 1]);
    else if (partner_chunk_aligned) partner = load_float(&partner_values[e]);
    else partner = load_float(row + (first ? pair.second : pair.first));
    const float value = rotate_value(load_float(&own_values[e]), partner, load_float(cos + pair_index),
                                     load_float(sin + pair_index), first);
    store_float(&out[e], value);
  }
  return result;
}

}  // namespace cuflash::detail
