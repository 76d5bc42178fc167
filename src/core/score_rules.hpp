// What happens to a score between q.k and the softmax, for one (sequence,
// query head): which keys a query row sees (the causal/window mask, the
// sequence's first and last key), the base-2 logit of a dot product
// (scale, softcap, ALiBi) and softcap's factor on dS for the backward. One
// definition for the CUDA kernels (built on the device by score_mask.cuh's
// score_rules) and the CPU reference (cpu_kernels.hpp's ScoreModel); the
// float64 oracle keeps its own, so that a mistake here shows.
//
// Positions i (query row) and j (key) count from the sequence's first row
// and key; key j is aligned with query i when j = i + offset (offset:
// k_len - q_len bottom-right, as flash-attn, or the call's diagonal_offset;
// docs/semantics.md).
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

struct ScoreRules {
  int offset = 0, k_first = 0, k_len = 0, window_left = -1, window_right = -1;
  float scale_log2 = 1.0f;       // raw dot -> base-2 logit when no softcap/ALiBi
  float scale_over_cap = 0.0f;   // softcap: tanh argument per unit of dot
  float cap_log2 = 0.0f;         // softcap: softcap * log2(e); 0 when off
  float alibi_log2 = 0.0f;       // slope * log2(e); 0 when off
  bool transformed = false;      // softcap or ALiBi: logit2() must be applied per element

  // (k_first's tests are written so that they vanish where k_first is the
  // constant 0 of seq_bounds(): the kernels without a KV cache compile as
  // they did without it.)
  CUFLASH_HOST_DEVICE bool visible(int i, int j) const {
    return j < k_len && (k_first == 0 || j >= k_first) && (window_right < 0 || j <= i + offset + window_right) &&
           (window_left < 0 || j >= i + offset - window_left);
  }
  // Keys [lo, hi) row i sees (lo >= hi: none).
  CUFLASH_HOST_DEVICE void row_keys(int i, int* lo, int* hi) const {
    *lo = window_left >= 0 ? larger(k_first, i + offset - window_left) : k_first;
    *hi = window_right >= 0 ? smaller(k_len, i + offset + window_right + 1) : k_len;
  }
  // Rows [lo, hi) of [0, q_len) that see key j (lo >= hi: none):
  // visible's rule as a range over the rows, with the sequence's rows, for a
  // kernel that holds S^T (keys along its rows: the backward), where each
  // score is then two compares against its key's bounds instead of
  // visible's tests. (64-bit: j - offset - window spans up to 2^31 for the
  // lengths validate() allows; the result is clamped to [0, q_len].)
  CUFLASH_HOST_DEVICE void key_rows(int j, int q_len, int* lo, int* hi) const {
    const std::int64_t aligned = static_cast<std::int64_t>(j) - offset;  // the row key j is aligned with
    std::int64_t l = 0, h = q_len;
    if (window_right >= 0 && aligned - window_right > l) l = aligned - window_right;
    if (window_left >= 0 && aligned + window_left + 1 < h) h = aligned + window_left + 1;
    if (j >= k_len || (k_first != 0 && j < k_first)) h = 0;
    *lo = static_cast<int>(l < q_len ? l : q_len);
    *hi = static_cast<int>(h > 0 ? h : 0);
  }
  // Base-2 logit of a raw dot product (only needed when `transformed`).
  CUFLASH_HOST_DEVICE float logit2(float dot, int i, int j) const { return logit2(dot, i, j, alibi_log2); }
  // The same with the ALiBi slope (times log2(e)) of another head of the
  // batch: the decode kernel holds several query heads in one CTA.
  CUFLASH_HOST_DEVICE float logit2(float dot, int i, int j, float slope_log2) const {
    float squashed;
    return logit2(dot, i, j, slope_log2, &squashed);
  }
  // The same for the backward, which also needs softcap's derivative: the
  // logit is cap * tanh(dot * scale / cap) (+ ALiBi), so d logit / d(scaled
  // dot) = 1 - tanh^2; *squashed receives that tanh (0 without softcap).
  CUFLASH_HOST_DEVICE float logit2(float dot, int i, int j, float slope_log2, float* squashed) const {
    float s;
    if (cap_log2 != 0.0f) {
      *squashed = tanhf(dot * scale_over_cap);
      s = cap_log2 * *squashed;
    } else {
      *squashed = 0.0f;
      s = dot * scale_log2;
    }
    if (slope_log2 != 0.0f) s -= slope_log2 * fabsf(static_cast<float>(i + offset - j));
    return s;
  }
  // Building the rules of one (sequence, head), in this order (the device's
  // score_rules and the CPU's ScoreModel):
  // The sequence: q_len rows, keys [k_first, k_len), key j aligned with
  // row i at j = i + offset; the call's windows (-1: unbounded).
  CUFLASH_HOST_DEVICE void set_sequence(int q_len, int k_len_, int k_first_, int offset_, int window_left_,
                                        int window_right_) {
    offset = offset_;
    k_first = k_first_;
    k_len = k_len_;
    // A window side that masks no key of the sequence is unbounded; clamping
    // them keeps i + offset +- window inside int32 whatever the caller passed.
    // (No overflow here: without diagonal_offset these are k_len - 1 and
    // q_len - 1; with it validate() holds |offset| and the lengths to 2^30.)
    window_left = window_left_ >= q_len - 1 + offset ? -1 : window_left_;
    window_right = window_right_ >= k_len - 1 - offset ? -1 : window_right_;
  }
  // The call's softmax_scale, scale_log2 = softmax_scale * log2(e) (the
  // caller's, computed once) and softcap (0: off).
  CUFLASH_HOST_DEVICE void set_scales(float softmax_scale, float scale_log2_, float softcap) {
    scale_log2 = scale_log2_;
    if (softcap > 0.0f) {
      scale_over_cap = softmax_scale / softcap;
      cap_log2 = softcap * kLog2e;
    }
  }
  // Then, where the call has ALiBi, alibi_log2 = the head's slope times
  // log2(e); last, whether the call has ALiBi (a slope of 0 still counts).
  CUFLASH_HOST_DEVICE void set_transformed(bool has_alibi) { transformed = cap_log2 != 0.0f || has_alibi; }

  // Softcap's factor on dS, from logit2's *squashed: 1 - tanh^2.
  CUFLASH_HOST_DEVICE static float softcap_grad(float squashed) { return 1.0f - squashed * squashed; }
  // Keys [lo, hi) that some row of [row0, row0 + rows) may see.
  CUFLASH_HOST_DEVICE void key_range(int row0, int rows, int* lo, int* hi) const {
    int l = k_first, h = k_len;
    if (window_left >= 0) l = larger(l, row0 + offset - window_left);
    if (window_right >= 0) h = smaller(h, row0 + rows - 1 + offset + window_right + 1);
    *lo = l;
    *hi = larger(h, l);
  }
  // Whether no row of [row0, row0 + rows) sees any key of [key0, key0 + keys)
  // (so the tile's scores are all masked: its probabilities and gradients
  // are zeros, and a kernel may skip its GEMMs).
  CUFLASH_HOST_DEVICE bool tile_hidden(int row0, int rows, int key0, int keys) const {
    int lo, hi;
    key_range(row0, rows, &lo, &hi);
    return lo >= hi || key0 + keys <= lo || key0 >= hi;  // (lo == hi: the rows see no key)
  }
  // Whether every row of [row0, row0+rows) sees every key of [key0, key0+keys)
  // (so the tile needs no per-element mask).
  CUFLASH_HOST_DEVICE bool tile_unmasked(int row0, int rows, int key0, int keys) const {
    if (key0 + keys > k_len || (k_first > 0 && key0 < k_first)) return false;
    if (window_right >= 0 && key0 + keys - 1 > row0 + offset + window_right) return false;
    if (window_left >= 0 && key0 < row0 + rows - 1 + offset - window_left) return false;
    return true;
  }
  // Keys [lo, hi) that every row of [row0, row0 + rows) sees (lo >= hi:
  // none): tile_unmasked's rule as a range, so that a kernel can find once
  // per block the tiles that need no mask test (for key0 >= 0,
  // tile_unmasked(row0, rows, key0, keys) is lo <= key0 && key0 + keys <= hi;
  // tile_unmasked keeps its own form, in which the k_first test vanishes
  // where k_first is the constant 0).
  CUFLASH_HOST_DEVICE void unmasked_keys(int row0, int rows, int* lo, int* hi) const {
    *lo = k_first;
    *hi = k_len;
    if (window_left >= 0) *lo = larger(*lo, row0 + rows - 1 + offset - window_left);
    if (window_right >= 0) *hi = smaller(*hi, row0 + offset + window_right + 1);
  }
  // For tiles of tile_keys keys walked down from tile t_hi - 1 (step j
  // holds keys [(t_hi - 1 - j) tile_keys, (t_hi - j) tile_keys)): the steps
  // [*j_lo, *j_hi) whose tile every row of [row0, row0 + rows) sees whole
  // (none when *j_lo >= *j_hi).
  CUFLASH_HOST_DEVICE void unmasked_steps_down(int row0, int rows, int t_hi, int tile_keys, int* j_lo,
                                               int* j_hi) const {
    int lo, hi;
    unmasked_keys(row0, rows, &lo, &hi);
    // The tile starts at or after lo: t_hi - 1 - j >= ceil(lo / tile_keys);
    // it ends at or before hi: t_hi - j <= floor(hi / tile_keys). (Tiles
    // start at key 0 or later, so a negative bound is 0.)
    *j_lo = t_hi - larger(hi, 0) / tile_keys;
    *j_hi = t_hi - (larger(lo, 0) + tile_keys - 1) / tile_keys;
  }

 private:
  // (The device's min/max: the kernels' index arithmetic compiles as it did
  // before these rules were shared.)
  CUFLASH_HOST_DEVICE static int larger(int a, int b) {
#if defined(__CUDA_ARCH__)
    return max(a, b);
#else
    return a > b ? a : b;
#endif
  }
  CUFLASH_HOST_DEVICE static int smaller(int a, int b) {
#if defined(__CUDA_ARCH__)
    return min(a, b);
#else
    return a < b ? a : b;
#endif
  }
};

}  // namespace cuflash::detail
