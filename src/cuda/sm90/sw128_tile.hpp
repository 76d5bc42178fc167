// The shared-memory layout of a ROWS x D tile of 2-byte elements that
// wgmma's 128-byte-swizzle descriptors read (wgmma.cuh: sw128_desc) and a
// 128-byte-swizzled TMA box writes (tma_map.hpp): the D columns in blocks of
// 64 (one 128-byte row each), block-major, so each block is ROWS rows of 128
// bytes and every 8 rows form one 1024-byte atom; 16-byte chunk c of row r
// sits at chunk c ^ (r % 8) of its row.
#pragma once

#include <cstdint>

namespace cuflash::detail::sm90 {

template <int ROWS, int D>
struct Sw128Tile {
  static_assert(D % 64 == 0, "columns in whole 64-element blocks");
  static constexpr int kRows = ROWS;
  static constexpr int kBlocks = D / 64;
  static constexpr int kBlockBytes = ROWS * 128;  // one 64-column block
  static constexpr int kBytes = kBlocks * kBlockBytes;
  // Element offset of 16-byte chunk `chunk` (0 .. D/8-1) of row `row`.
  __host__ __device__ static constexpr int offset(int row, int chunk) {
    return (chunk / 8) * (kBlockBytes / 2) + row * 64 + ((chunk % 8) ^ (row % 8)) * 8;
  }
  // Bytes from the start of a K-major wgmma operand in this layout (rows are
  // M or N, columns K) to its ks-th K step of 16 elements: 32 bytes along a
  // 128-byte row, the next 64-column block every 4 steps (the descriptor's
  // start address moves; the swizzle follows the address).
  __host__ __device__ static constexpr std::uint32_t k_major_step_bytes(int ks) {
    return (ks / 4) * kBlockBytes + (ks % 4) * 32;
  }
  // Bytes from the start of an MN-major operand (rows are K) to its ks-th K
  // step: 16 rows of 128 bytes.
  __host__ __device__ static constexpr std::uint32_t mn_major_step_bytes(int ks) { return ks * 16 * 128; }
  // Rows [first_row, ROWS) of `tile` set to zero by one warp (`lane` its
  // lane), 16 bytes per store: the rows of a varlen tile past its sequence,
  // which TMA loaded from the next sequence or from rows no sequence owns.
  template <typename T>
  __device__ __forceinline__ static void zero_rows_from(T* tile, int first_row, int lane) {
    constexpr int kChunksPerRow = D / 8;
    for (int idx = lane; idx < (ROWS - first_row) * kChunksPerRow; idx += 32)
      *reinterpret_cast<uint4*>(tile + offset(first_row + idx / kChunksPerRow, idx % kChunksPerRow)) =
          make_uint4(0, 0, 0, 0);
  }
};

}  // namespace cuflash::detail::sm90
