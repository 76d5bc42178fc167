// The CPU backend's passes and the tile math they share.
//
// Scores are kept in base 2: t = log2(e) * s, so that the online softmax uses
// exp2 and the softmax scale (and log2(e)) can be folded into q once per row
// instead of once per score.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "linear_problem.hpp"
#include "problem.hpp"
#include "score_rules.hpp"

namespace cuflash::detail::cpu {

// Entry points; they throw only std::bad_alloc (scratch memory).
void run_forward(const Problem& problem);   // KV-cache append, then out (and lse)
void run_backward(const Problem& problem);  // dq, dk, dv: every element
void run_merge(const MergeProblem& problem);
// The forward's debug output: attn_probs (normalized probabilities, dropped
// entries negated), after run_forward (which did the KV-cache append).
void write_attention_probabilities(const Problem& problem);
// dsinks[h] = -sum over (b, i) of exp(sinks[h] - lse) * dot(dout_i, out_i).
void write_sink_gradients(const Problem& problem);
// Linear attention (linear_attention.cpp): the forward (and decode step) writes
// out and the final state/key sum; the backward dq, dk, dv (every element) and
// the initial state's gradients.
void run_linear_forward(const LinearProblem& problem);
void run_linear_backward(const LinearProblem& problem);

inline constexpr int kQueryBlock = 32;  // query rows that share one pass over the key tiles
inline constexpr int kKeyTile = 64;     // keys per inner-loop tile
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row length of every float scratch row: head_dim rounded up to the 8-wide
// register blocks of multiply_add, the padding kept at zero.
inline int padded_dim(int head_dim) { return (head_dim + 7) / 8 * 8; }
inline int round_up4(int value) { return (value + 3) / 4 * 4; }

// Four floats as one SIMD register (a GCC/Clang vector extension, lowered to
// SSE on baseline x86-64 and NEON on ARM). Written explicitly because the
// autovectorizer turns the register-blocked product below into shuffles.
using Float4 = float __attribute__((vector_size(16)));

inline Float4 load4(const float* source) {
  Float4 value;
  std::memcpy(&value, source, sizeof value);
  return value;
}

inline void store4(float* destination, Float4 value) { std::memcpy(destination, &value, sizeof value); }

using Int4 = std::int32_t __attribute__((vector_size(16)));

// 2^x for four floats at once, within about 1.1 ulp of the exact result
// (a libm exp2f call per score cost a fifth of the forward). x = n + f with n an integer
// and |f| <= 1/2; 2^f by its degree-7 Taylor polynomial (truncation below
// 1e-8 relative); 2^n applied as two exact power-of-two factors so that
// results in the subnormal range are rounded once, like exp2f's. -inf gives
// 0, large x gives inf, NaN stays NaN.
inline Float4 exp2_4(Float4 x) {
  const Float4 low = Float4{} - 160.0f;
  const Float4 high = Float4{} + 160.0f;
  x = x < low ? low : x;  // NaN compares false and passes through
  x = x > high ? high : x;
  const Float4 round_magic = Float4{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const Float4 whole = (x + round_magic) - round_magic;
  const Float4 f = x - whole;
  Float4 p = Float4{} + 1.5252733804059841e-05f;  // ln2^7 / 7!
  p = p * f + 1.5403530393381608e-04f;            // ln2^6 / 6!
  p = p * f + 1.3333558146428443e-03f;            // ln2^5 / 5!
  p = p * f + 9.6181291076284772e-03f;            // ln2^4 / 4!
  p = p * f + 5.5504108664821580e-02f;            // ln2^3 / 3!
  p = p * f + 2.4022650695910071e-01f;            // ln2^2 / 2!
  p = p * f + 6.9314718055994531e-01f;            // ln2
  p = p * f + 1.0f;
  // NaN to int is undefined behaviour (clang really exploits it): convert 0
  // instead; p is NaN already.
  const Int4 n = __builtin_convertvector(whole == whole ? whole : Float4{}, Int4);
  const Int4 half = n >> 1;
  const Int4 first_bits = (half + 127) << 23;
  const Int4 second_bits = (n - half + 127) << 23;
  Float4 first, second;
  std::memcpy(&first, &first_bits, sizeof first);
  std::memcpy(&second, &second_bits, sizeof second);
  return p * first * second;
}

// values[j] = 2^(values[j] - offset) for j < count.
inline void exp2_shifted(float* values, int count, float offset) {
  int j = 0;
  for (; j + 4 <= count; j += 4) store4(values + j, exp2_4(load4(values + j) - offset));
  if (j < count) {
    float tail[4] = {};
    std::memcpy(tail, values + j, sizeof(float) * (count - j));
    const Float4 result = exp2_4(load4(tail) - offset);
    std::memcpy(values + j, &result, sizeof(float) * (count - j));
  }
}

// Sum of values[0..count) in four interleaved partial sums: a fixed order,
// so the same inputs always give the same bits.
inline float sum_of(const float* values, int count) {
  Float4 partial{};
  int j = 0;
  for (; j + 4 <= count; j += 4) partial += load4(values + j);
  float total = (partial[0] + partial[1]) + (partial[2] + partial[3]);
  for (; j < count; ++j) total += values[j];
  return total;
}

// The 4 x (kVectors * vector width) block of c at c_block: it stays in
// registers while depth streams by; per step kVectors loads of b, four
// broadcasts of a, 8 * kVectors multiplies and adds. Each element of c is a
// sum in order of depth of separately rounded products (no fused
// multiply-add), so every vector width gives the same bits.
template <bool kAccumulate, typename Vector, int kVectors>
[[gnu::always_inline]] inline void multiply_add_block(const float* a_rows, int lda, const float* b_column, int ldb,
                                                      float* c_block, int ldc, int depth) {
  constexpr int kWidth = static_cast<int>(sizeof(Vector) / sizeof(float));
  Vector block[4][kVectors];
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < kVectors; ++v) {
      block[r][v] = Vector{};
      if (kAccumulate) std::memcpy(&block[r][v], c_block + r * ldc + v * kWidth, sizeof(Vector));
    }
  for (int k = 0; k < depth; ++k, b_column += ldb) {
    Vector b_parts[kVectors];
    for (int v = 0; v < kVectors; ++v) std::memcpy(&b_parts[v], b_column + v * kWidth, sizeof(Vector));
    for (int r = 0; r < 4; ++r) {
      const float a_value = a_rows[r * lda + k];
      for (int v = 0; v < kVectors; ++v) block[r][v] += a_value * b_parts[v];
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int v = 0; v < kVectors; ++v) std::memcpy(c_block + r * ldc + v * kWidth, &block[r][v], sizeof(Vector));
}

template <bool kAccumulate, typename Vector>
[[gnu::always_inline]] inline void multiply_add_with(const float* a, int lda, const float* b, int ldb, float* c,
                                                     int ldc, int rows, int cols, int depth) {
  constexpr int kWidth = static_cast<int>(sizeof(Vector) / sizeof(float));
  for (int row = 0; row < rows; row += 4) {
    const float* a_rows = a + static_cast<std::int64_t>(row) * lda;
    float* c_rows = c + static_cast<std::int64_t>(row) * ldc;
    int col = 0;
    for (; col + 2 * kWidth <= cols; col += 2 * kWidth)
      multiply_add_block<kAccumulate, Vector, 2>(a_rows, lda, b + col, ldb, c_rows + col, ldc, depth);
    for (; col < cols; col += kWidth)
      multiply_add_block<kAccumulate, Vector, 1>(a_rows, lda, b + col, ldb, c_rows + col, ldc, depth);
  }
}

#if defined(__x86_64__) || defined(__i386__)
#define CUFLASH_CPU_HAS_AVX_PATH 1
// Eight-wide AVX (without FMA, so the same bits as the SSE path), chosen at
// run time: the library itself is built for baseline x86-64.
using Float8 = float __attribute__((vector_size(32)));

template <bool kAccumulate>
__attribute__((target("avx"))) void multiply_add_avx(const float* a, int lda, const float* b, int ldb, float* c,
                                                     int ldc, int rows, int cols, int depth) {
  multiply_add_with<kAccumulate, Float8>(a, lda, b, ldb, c, ldc, rows, cols, depth);
}

inline bool cpu_has_avx() {
  static const bool has_avx = __builtin_cpu_supports("avx");
  return has_avx;
}
#endif

// c[rows][cols] (+)= a[rows][depth] * b[depth][cols]; rows a multiple of 4,
// cols of 8; lda, ldb, ldc are row strides in floats.
template <bool kAccumulate>
inline void multiply_add(const float* a, int lda, const float* b, int ldb, float* c, int ldc, int rows, int cols,
                         int depth) {
#ifdef CUFLASH_CPU_HAS_AVX_PATH
  if (cpu_has_avx()) return multiply_add_avx<kAccumulate>(a, lda, b, ldb, c, ldc, rows, cols, depth);
#endif
  multiply_add_with<kAccumulate, Float4>(a, lda, b, ldb, c, ldc, rows, cols, depth);
}

// Inclusive range of keys query row `row` may see; first > last when none.
struct KeyRange {
  std::int64_t first = 0;
  std::int64_t last = -1;
  bool empty() const { return first > last; }
};

// Everything about a score except q.k, for the CPU kernels: the shared
// score rules (score_rules.hpp: scale, softcap, ALiBi, the window mask) of
// each (sequence, head), attention sinks and dropout.
class ScoreModel {
 public:
  explicit ScoreModel(const Problem& problem) : problem_(problem) {}

  bool has_softcap() const { return problem_.softcap > 0.0f; }

  // The rules of sequence b without ALiBi: which keys its query rows see
  // (bottom-right aligned, or the call's diagonal_offset) and the scales.
  ScoreRules sequence_rules(int b) const {
    const int q_len = problem_.q_len(b), kv_len = problem_.kv_len(b);
    // |diagonal_offset| <= 2^30 (validate).
    const int offset = problem_.has_diagonal_offset ? static_cast<int>(problem_.diagonal_offset) : kv_len - q_len;
    ScoreRules r;
    r.set_sequence(q_len, kv_len, problem_.kv_first(b), offset, problem_.window_left, problem_.window_right);
    r.set_scales(problem_.softmax_scale, problem_.softmax_scale * kLog2e, problem_.softcap);
    r.set_transformed(problem_.has_alibi);
    return r;
  }
  // The rules of (sequence b, query head): sequence_rules with the head's
  // ALiBi slope.
  ScoreRules rules(int b, int head) const {
    ScoreRules r = sequence_rules(b);
    if (problem_.has_alibi) r.alibi_log2 = alibi_slope_log2e(b, head);
    return r;
  }

  // Keys query row `row` sees (an inclusive range, empty when none).
  static KeyRange visible_keys(const ScoreRules& rules, int row) {
    int lo = 0, hi = 0;
    rules.row_keys(row, &lo, &hi);
    return {lo, static_cast<std::int64_t>(hi) - 1};
  }
  // Keys any of rows [first_row, end_row) sees, as one inclusive range.
  static KeyRange rows_keys(const ScoreRules& rules, int first_row, int end_row) {
    KeyRange all{rules.k_len, -1};
    for (int row = first_row; row < end_row; ++row) {
      const KeyRange keys = visible_keys(rules, row);
      if (keys.empty()) continue;
      all.first = std::min(all.first, keys.first);
      all.last = std::max(all.last, keys.last);
    }
    return all;
  }

  // The attention sink of a query head, times log2(e); -inf without sinks
  // (a sink of -inf is no sink: exp(-inf) = 0 joins no denominator).
  float sink_log2e(int head) const {
    if (!problem_.has_sinks) return kNegInf;
    const TensorView& sinks = problem_.sinks;
    return static_cast<const float*>(sinks.data)[head * sinks.strides[0]] * kLog2e;
  }

  // Zeroes the entries of one row that dropout drops (keys first_key..).
  void drop(float* values, int count, int batch_index, int head, int row, std::int64_t first_key) const {
    if (!problem_.has_dropout()) return;
    for (int j = 0; j < count; ++j)
      if (!dropout_keeps(problem_.dropout, batch_index, head, problem_.heads_q, row, first_key + j)) values[j] = 0.0f;
  }
  // 1 / (1 - dropout_p): the scale of the kept entries.
  float dropout_scale() const { return problem_.dropout_keep_scale(); }

  // Turns the count dot products of query row `row` with keys first_key..
  // into base-2 scores in place: the rules' scale, softcap and ALiBi, then
  // -inf outside the row's visible keys. With softcap, tanh_out (if given)
  // receives softcap's tanh of each score for the backward
  // (ScoreRules::softcap_grad).
  static void finish_scores(float* scores, int count, int first_key, int row, const ScoreRules& rules,
                            float* tanh_out) {
    if (rules.transformed) {
      for (int j = 0; j < count; ++j) {
        float squashed;
        scores[j] = rules.logit2(scores[j], row, first_key + j, rules.alibi_log2, &squashed);
        if (tanh_out) tanh_out[j] = squashed;
      }
    } else {
      for (int j = 0; j < count; ++j) scores[j] *= rules.scale_log2;
    }
    const KeyRange visible = visible_keys(rules, row);
    const std::int64_t visible_begin = std::clamp<std::int64_t>(visible.first - first_key, 0, count);
    const std::int64_t visible_end = std::clamp<std::int64_t>(visible.last + 1 - first_key, visible_begin, count);
    for (std::int64_t j = 0; j < visible_begin; ++j) scores[j] = kNegInf;
    for (std::int64_t j = visible_end; j < count; ++j) scores[j] = kNegInf;
  }

 private:
  // The alibi slope of (sequence, query head), times log2(e).
  float alibi_slope_log2e(int batch_index, int head) const {
    const TensorView& slopes = problem_.alibi_slopes;
    const std::int64_t offset = problem_.alibi_per_batch ? batch_index * slopes.strides[0] + head * slopes.strides[1]
                                                         : head * slopes.strides[0];
    return static_cast<const float*>(slopes.data)[offset] * kLog2e;
  }

  const Problem& problem_;
};

}  // namespace cuflash::detail::cpu
