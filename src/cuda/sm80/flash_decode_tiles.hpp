// Tile shapes of the decode / paged kernel (sm80/flash_decode_kernel.cuh),
// shared by the host (grid, split count, workspace, shared memory) and the
// kernel instantiations, so the two agree.
//
// Every head dim takes 64 keys per tile, 16 per warp (the k extent of one
// P V mma); what varies is how many tiles are in flight. Decode reads every
// K/V byte once and does ~2 FLOP per byte, so the kernel is a copy loop:
// it needs bytes in flight, not math. Stages are chosen so that two CTAs fit
// an H100 SM (228 KiB) where they can (more loads in flight, and one CTA's
// prologue/epilogue overlaps the other's streaming), and so that every shape
// also fits an A100's 163 KiB per block.
#pragma once

#include "common/swizzled_rows.hpp"

namespace cuflash::detail::sm80 {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeBlockN = 64;  // keys per tile: 16 per warp

struct DecodeTile {
  int stages;      // K+V tiles in the cp.async pipeline
  int max_m_tiles; // m16 tiles of query rows one CTA may hold (registers of O)
};

constexpr DecodeTile decode_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {4, 2};   // 8 KiB per stage
    case 64: return {4, 2};   // 16 KiB
    case 96: return {3, 2};   // 32 KiB (rows padded to 128 elements by the swizzle)
    case 128: return {3, 2};  // 32 KiB
    case 192: return {2, 1};  // 48 KiB
    case 256: return {2, 1};  // 64 KiB
    default: return {0, 0};
  }
}

// The wide variant: one CTA reads several kv heads of the same keys, a warp
// per head and 16 keys per tile, so that each key's rows are read as one
// 1-2 KiB run of the [.., slot, Hk, D] cache instead of 128-512-byte pieces
// by different CTAs. What it buys is page-order independence: a shuffled
// block table costs the per-head kernel ~1.3% of DRAM throughput at large
// batch (32 KiB pages scattered over the cache), a per-page reader ~0-0.8%
// (NOTES.md, decode round 4). Only for one m16 tile of rows (decode and
// speculative decode of GQA groups up to 16 rows) and head dims whose rows
// tile the CTA: 0 means no wide variant.
constexpr int decode_wide_heads(int head_dim) {
  switch (head_dim) {
    case 64: return 8;   // 1 KiB per key
    case 128: return 8;  // 2 KiB
    case 256: return 4;  // 2 KiB
    default: return 0;
  }
}
inline constexpr int kDecodeWideBlockN = 16;  // keys per tile: all of them per warp
inline constexpr int kDecodeWideStages = 2;   // 64 KiB per stage at 2 KiB per key

// What a CTA of either variant holds.
struct DecodeShape {
  int heads;    // kv heads per CTA
  int warps;
  int block_n;  // keys per tile
  int stages;
};

constexpr DecodeShape decode_shape(int head_dim, bool wide) {
  if (wide) {
    const int heads = decode_wide_heads(head_dim);
    return {heads, heads, kDecodeWideBlockN, kDecodeWideStages};
  }
  return {1, kDecodeWarps, kDecodeBlockN, decode_tile(head_dim).stages};
}

// Query rows one CTA holds: the group's heads x q_len rows, padded to m16
// tiles; longer rows (long chunks, large groups) are cut into row blocks that
// each stream the keys again (from L2 when they run together).
constexpr int decode_m_tiles(int head_dim, int rows) {
  return rows > 16 && decode_tile(head_dim).max_m_tiles >= 2 ? 2 : 1;
}

// Shared memory of one CTA, bytes: Q of each head, the K/V stages, per-warp
// row stats. (The epilogue's float partial outputs reuse the stage buffers.)
constexpr int decode_smem_bytes(int head_dim, int m_tiles, int element_bytes, bool wide = false) {
  const DecodeShape shape = decode_shape(head_dim, wide);
  const int row = swizzled_pitch(head_dim);
  return (shape.heads * 16 * m_tiles * row + shape.stages * 2 * shape.heads * shape.block_n * row) * element_bytes +
         2 * shape.warps * 16 * m_tiles * 4;
}

inline constexpr int kDecodeMaxSplits = 64;  // combine_splits' limit
inline constexpr int kDecodeMinTilesPerSplit = 2;

// The split count (flash_decode.cu's choose_splits, here so that the CPU
// tests can pin the rule down): `ctas` (sequence, kv head, row block) CTAs,
// `slots` CTAs the GPU holds at once (SMs x CTAs per SM), `tiles` the key
// tiles a CTA may have to read. No split when the CTAs fill 80% of the
// slots; else about one CTA per slot, never more than one wave, at most
// kDecodeMaxSplits splits and at least two tiles per split. Non-decreasing
// in `tiles`, which the workspace bound relies on.
constexpr int decode_splits(long long ctas, long long slots, long long tiles) {
  if (ctas <= 0 || slots <= 0 || ctas * 5 >= slots * 4) return 1;
  long long splits = slots / ctas;
  const long long by_tiles = tiles / kDecodeMinTilesPerSplit;
  if (splits > by_tiles) splits = by_tiles;
  if (splits > kDecodeMaxSplits) splits = kDecodeMaxSplits;
  return splits < 1 ? 1 : static_cast<int>(splits);
}

}  // namespace cuflash::detail::sm80
