// Philox4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as
// easy as 1, 2, 3", SC 2011) and the dropout mask defined on it. Header-only
// and callable from host and device code alike, so that the CPU backend, the
// float64 oracle and (later) the CUDA kernels draw the same mask bit for bit.
//
// The dropout mask (docs/semantics.md, "Dropout"): for sequence b, query head
// h (of heads_q), query row i and key j of that sequence (i, j counted from
// the sequence's first row and key, in every layout), with the call's
// 64-bit seed and offset:
//   key     = (lo32(seed), hi32(seed))
//   stream  = offset + b * heads_q + h                 (64-bit, wrapping)
//   counter = (j / 8, i, lo32(stream), hi32(stream))   (words x0..x3)
//   w       = philox4x32_10(counter, key).word[(j % 8) / 2]
//   draw16  = j even ? (w & 0xFFFF) : (w >> 16)         (low half for even j,
//                                                        high half for odd j)
//   kept    = draw16 >= threshold16,  threshold16 = dropout_threshold16(p)
// So one Philox block gives the eight 16-bit draws of keys 8 m .. 8 m + 7 of
// a row: key 8 m + k is bits 16 (k % 2) .. 16 (k % 2) + 15 of word k / 2.
// threshold16 = min(floor(p * 65536), 65535); threshold16 = 0 keeps every
// entry. The keep probability is 1 - threshold16 / 65536, within 2^-16 of
// 1 - p, while a kept entry is still scaled by 1 / (1 - p) (flash-attn's
// definition), so the expected value of a dropped-out entry is biased by
// less than 2^-16 / (1 - p) relative.
// A call uses the streams offset .. offset + B * heads_q - 1: a caller that
// advances one offset between calls advances it by B * heads_q or more.
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail {

struct Philox4x32 {
  std::uint32_t word[4];
};

// One Philox4x32 block: 10 rounds of two 32x32->64 multiplies, with the key
// bumped by the Weyl constants between rounds.
CUFLASH_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 counter, std::uint32_t key0, std::uint32_t key1) {
  constexpr std::uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr std::uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u;
  constexpr std::uint32_t kWeyl1 = 0xBB67AE85u;
  std::uint32_t x0 = counter.word[0], x1 = counter.word[1], x2 = counter.word[2], x3 = counter.word[3];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t product0 = static_cast<std::uint64_t>(kMultiplier0) * x0;
    const std::uint64_t product1 = static_cast<std::uint64_t>(kMultiplier1) * x2;
    const auto high0 = static_cast<std::uint32_t>(product0 >> 32), low0 = static_cast<std::uint32_t>(product0);
    const auto high1 = static_cast<std::uint32_t>(product1 >> 32), low1 = static_cast<std::uint32_t>(product1);
    x0 = high1 ^ x1 ^ key0;
    x1 = low1;
    x2 = high0 ^ x3 ^ key1;
    x3 = low0;
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return {{x0, x1, x2, x3}};
}

// An entry is kept when its 16-bit draw is >= this: floor(p * 65536), at most
// 65535, computed in double (exact for every float p). Keep probability
// 1 - threshold16 / 65536, within 2^-16 of 1 - p.
CUFLASH_HOST_DEVICE std::uint32_t dropout_threshold16(float dropout_p) {
  const double scaled = static_cast<double>(dropout_p) * 65536.0;
  if (!(scaled > 0.0)) return 0u;
  if (scaled >= 65535.0) return 0xFFFFu;
  return static_cast<std::uint32_t>(scaled);
}

// The call's dropout parameters, as kernels need them.
struct DropoutRng {
  std::uint64_t seed = 0;
  std::uint64_t offset = 0;
  std::uint32_t threshold16 = 0;  // dropout_threshold16(p), 0 .. 65535; 0: nothing is dropped
};

// The Philox stream of (sequence b, query head h): one per row block of the
// mask, so a kernel working on one (b, h) computes it once.
CUFLASH_HOST_DEVICE std::uint64_t dropout_stream(const DropoutRng& rng, std::int64_t batch_index, std::int64_t head,
                                                 std::int64_t heads_q) {
  return rng.offset + static_cast<std::uint64_t>(batch_index * heads_q + head);
}

// The Philox block of keys 8 * (key / 8) .. 8 * (key / 8) + 7 of one row of a
// stream: eight 16-bit draws, key 8 m + k in half k % 2 of word k / 2. A
// kernel computes it once per (row, 8-key group), e.g. once per (row, n8
// block) of an mma.sync tile.
CUFLASH_HOST_DEVICE Philox4x32 dropout_draws_in_stream(const DropoutRng& rng, std::uint64_t stream, std::int64_t row,
                                                       std::int64_t key) {
  const Philox4x32 counter{{static_cast<std::uint32_t>(static_cast<std::uint64_t>(key) >> 3),
                            static_cast<std::uint32_t>(row), static_cast<std::uint32_t>(stream),
                            static_cast<std::uint32_t>(stream >> 32)}};
  return philox4x32_10(counter, static_cast<std::uint32_t>(rng.seed), static_cast<std::uint32_t>(rng.seed >> 32));
}

CUFLASH_HOST_DEVICE Philox4x32 dropout_draws(const DropoutRng& rng, std::int64_t batch_index, std::int64_t head,
                                             std::int64_t heads_q, std::int64_t row, std::int64_t key) {
  return dropout_draws_in_stream(rng, dropout_stream(rng, batch_index, head, heads_q), row, key);
}

// The 16-bit draw of key 8 m + k (k = key % 8) from its group's Philox block.
CUFLASH_HOST_DEVICE std::uint32_t dropout_draw16(const Philox4x32& draws, int k) {
  return (draws.word[(k & 7) >> 1] >> (16 * (k & 1))) & 0xFFFFu;
}

// The keep bits of the eight keys of one Philox block: bit k is set when key
// 8 m + k is kept (draw16 >= threshold16; threshold16 = 0 keeps all eight).
CUFLASH_HOST_DEVICE std::uint32_t dropout_keep_byte_of(const Philox4x32& draws, std::uint32_t threshold16) {
  std::uint32_t byte = 0;
  for (int w = 0; w < 4; ++w) {
    byte |= ((draws.word[w] & 0xFFFFu) >= threshold16 ? 1u : 0u) << (2 * w);
    byte |= ((draws.word[w] >> 16) >= threshold16 ? 1u : 0u) << (2 * w + 1);
  }
  return byte;
}

// The keep bits of keys key_group_first .. key_group_first + 7 of `row` of a
// stream (key_group_first a multiple of 8): bit k set when key
// key_group_first + k is kept. One Philox block.
CUFLASH_HOST_DEVICE std::uint32_t dropout_keep_byte(const DropoutRng& rng, std::uint64_t stream, std::int64_t row,
                                                    std::int64_t key_group_first) {
  if (rng.threshold16 == 0u) return 0xFFu;
  return dropout_keep_byte_of(dropout_draws_in_stream(rng, stream, row, key_group_first), rng.threshold16);
}

// Whether entry (b, h, i, j) of the probabilities is kept (not dropped).
CUFLASH_HOST_DEVICE bool dropout_keeps(const DropoutRng& rng, std::int64_t batch_index, std::int64_t head,
                                       std::int64_t heads_q, std::int64_t row, std::int64_t key) {
  if (rng.threshold16 == 0u) return true;
  return dropout_draw16(dropout_draws(rng, batch_index, head, heads_q, row, key), static_cast<int>(key & 7)) >=
         rng.threshold16;
}

}  // namespace cuflash::detail
