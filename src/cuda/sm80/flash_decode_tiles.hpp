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

namespace cuflash::detail::sm80 {

inline constexpr int kDecodeWarps = 4;
inline constexpr int kDecodeBlockN = 64;  // keys per tile: 16 per warp

struct DecodeTile {
  int stages;      // K+V tiles in the cp.async pipeline
  int max_m_tiles; // m16 tiles of query rows one CTA may hold (registers of O)
};

constexpr DecodeTile decode_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {4, 2};   // 10 KiB per stage
    case 64: return {4, 2};   // 18 KiB
    case 96: return {4, 2};   // 26 KiB
    case 128: return {3, 2};  // 34 KiB
    case 192: return {2, 1};  // 50 KiB
    case 256: return {2, 1};  // 66 KiB
    default: return {0, 0};
  }
}

// Query rows one CTA holds: the group's heads x q_len rows, padded to m16
// tiles; longer rows (long chunks, large groups) are cut into row blocks that
// each stream the keys again (from L2 when they run together).
constexpr int decode_m_tiles(int head_dim, int rows) {
  return rows > 16 && decode_tile(head_dim).max_m_tiles >= 2 ? 2 : 1;
}

// Shared memory of one CTA, bytes: Q, the K/V stages, per-warp row stats.
// (The epilogue's float partial outputs reuse the stage buffers.)
constexpr int decode_smem_bytes(int head_dim, int m_tiles, int element_bytes) {
  const int row = head_dim + 8;
  return (16 * m_tiles * row + decode_tile(head_dim).stages * 2 * kDecodeBlockN * row) * element_bytes +
         2 * kDecodeWarps * 16 * m_tiles * 4;
}

}  // namespace cuflash::detail::sm80
