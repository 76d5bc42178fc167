// The rotary embedding of a KV-cache forward (flash-attn's rotary_cos /
// rotary_sin; docs/semantics.md, "Rotary embedding"): which columns pair up,
// at which position a row is rotated, and the arithmetic. Header-only and
// callable from host and device code, so that backend cpu and the cuda
// kernels apply one rule (the float64 oracle has its own, on purpose).
//
// With rotary_dim = 2 * (columns of cos/sin), the rotated columns are
// c < rotary_dim, in rotary_dim / 2 pairs; pair k takes the angle in column
// k of the cos/sin row of the position:
//   GPT-NeoX (interleaved = false): pair k = (k, k + rotary_dim / 2)
//   GPT-J    (interleaved = true):  pair k = (2k, 2k + 1)
// and (first, second) becomes (first cos - second sin, first sin + second cos).
// Columns >= rotary_dim are not changed.
#pragma once

#include "host_device.hpp"

namespace cuflash::detail {

struct RotaryPair {
  int first, second;  // columns
};

// The columns of pair `index` (< rotary_dim / 2).
CUFLASH_HOST_DEVICE RotaryPair rotary_pair(int index, int rotary_dim, bool interleaved) {
  if (interleaved) return {2 * index, 2 * index + 1};
  return {index, index + rotary_dim / 2};
}

// The pair that column `column` (< rotary_dim) belongs to: also the column of
// cos/sin holding its angle.
CUFLASH_HOST_DEVICE int rotary_pair_index(int column, int rotary_dim, bool interleaved) {
  if (interleaved) return column / 2;
  const int half = rotary_dim / 2;
  return column < half ? column : column - half;
}

// The row of cos/sin that appended key n of a sequence holding `cached` keys
// before the append is rotated at: its cache row (a leftpad does not move it,
// as in flash-attn, which adds the leftpad back).
CUFLASH_HOST_DEVICE int rotary_key_position(int cached, int n) { return cached + n; }

// ... and query row i: positional (a causal or windowed call, whose queries
// follow the cached keys one position each) at cached + i, else every query
// at cached, as flash-attn does.
CUFLASH_HOST_DEVICE int rotary_query_position(int cached, int i, bool positional) {
  return positional ? cached + i : cached;
}

// One rotated value in fp32: `first` x = (x, y) cos - ..., else the second of
// the pair. Two products and one sum, each rounded once (no fused
// multiply-add on the device), as the torch operations flash-attn's Python
// rotary (and cuflash's before it) use; the caller rounds the result once to
// the tensor's dtype.
CUFLASH_HOST_DEVICE float rotate_value(float x, float partner, float cos, float sin, bool first) {
#if defined(__CUDA_ARCH__)
  return first ? __fsub_rn(__fmul_rn(x, cos), __fmul_rn(partner, sin))
               : __fadd_rn(__fmul_rn(x, cos), __fmul_rn(partner, sin));
#else
  const float x_cos = x * cos;
  const float partner_sin = partner * sin;
  return first ? x_cos - partner_sin : x_cos + partner_sin;
#endif
}

}  // namespace cuflash::detail
