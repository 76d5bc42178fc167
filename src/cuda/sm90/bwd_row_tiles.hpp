// Where the Hopper backward keeps its per-row fp32 data (sm90/flash_bwd_tma_kernel.cuh):
// the base-2 lse, dsum = dot(dO, O) and the dQ accumulator of every query
// row, per query head, in rows padded so that each sequence starts on a
// 64-row tile: a tile's lse and dsum are 256 aligned bytes and its dQ 64 x D
// contiguous floats, so one bulk copy loads the first and one bulk
// reduction adds the last, with no row of another sequence in between.
//
// Sequence b (first packed row q_start: b * max_q_len dense, cu_seqlens_q[b]
// varlen) starts at padded row (q_start + 64 b) rounded down to 64: at most
// q_start + 64 b, and more than the previous sequence's padded start plus
// its length, so sequences never overlap; all rows fit in
// padded_rows(total rows, batch).
//
// Inside a tile the dQ accumulator is in the order the consumer warpgroups
// hold it (wgmma's accumulator fragments: warpgroup c has the columns
// [c D/2, (c+1) D/2) (ColumnBlocks = 2), or all of them (1: a consumer's
// own 64-row tile of a 128-row query tile), warp w
// the rows [16 w, 16 w + 16), lane l its four floats of each n8 column
// block), so that each warp stores whole 512-byte lines to shared memory
// without bank conflicts and the tile leaves in one piece; the conversion to
// dq reads it back in that order (quad()).
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail::sm90 {

inline constexpr int kBwdTileRows = 64;

CUFLASH_HOST_DEVICE constexpr std::int64_t bwd_padded_start(std::int64_t q_start, int b) {
  return (q_start + static_cast<std::int64_t>(kBwdTileRows) * b) / kBwdTileRows * kBwdTileRows;
}
CUFLASH_HOST_DEVICE constexpr std::int64_t bwd_padded_rows(std::int64_t total_rows, int batch) {
  return (total_rows + static_cast<std::int64_t>(kBwdTileRows) * (batch + 1) - 1) / kBwdTileRows * kBwdTileRows;
}

template <int D, int ColumnBlocks = 2>
struct DqTileOrder {
  static constexpr int kColsPerConsumer = D / ColumnBlocks;
  static constexpr int kBlocks = kColsPerConsumer / 8;  // n8 column blocks per warpgroup
  static constexpr int kFloats = kBwdTileRows * D;
  // First float of n8 block i of warp w in column block c: 32 lanes x 4 floats.
  CUFLASH_HOST_DEVICE static constexpr int block(int c, int w, int i) { return ((c * 4 + w) * kBlocks + i) * 128; }
  // Element (row, col) of the 64 x D tile (the accumulator layout of
  // wgmma.cuh: lane 4 g + t holds rows 16 w + g (floats 0, 1) and
  // 16 w + g + 8 (floats 2, 3) at columns 8 i + 2 t, 8 i + 2 t + 1).
  CUFLASH_HOST_DEVICE static constexpr int index(int row, int col) {
    const int c = col / kColsPerConsumer, i = (col % kColsPerConsumer) / 8;
    const int w = row / 16, g = row % 8, half = (row % 16) / 8, t = (col % 8) / 2;
    return block(c, w, i) + (g * 4 + t) * 4 + half * 2 + col % 2;
  }
  // The inverse, four floats at a time: floats 4 q .. 4 q + 3 (one lane's
  // fragment of an n8 block) are the elements (row, col), (row, col + 1),
  // (row + 8, col), (row + 8, col + 1). The conversion to dq reads the tile
  // in this order, so that each warp reads whole 512-byte lines.
  struct Quad {
    int row, col;
  };
  CUFLASH_HOST_DEVICE static constexpr Quad quad(int q) {
    const int lane = q % 32, blk = q / 32;  // a block is 32 lanes' four floats
    const int i = blk % kBlocks, w = blk / kBlocks % 4, c = blk / kBlocks / 4;
    return {16 * w + lane / 4, c * kColsPerConsumer + 8 * i + 2 * (lane % 4)};
  }
};

}  // namespace cuflash::detail::sm90
