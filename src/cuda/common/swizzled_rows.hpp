// Shared-memory layout of a tile of rows of D 2-byte elements, in 16-byte
// chunks, with no padding and the chunks of each row permuted (XOR with the
// row) so that both of its users run at full speed:
//  - cp.async: a quarter-warp's eight 16-byte stores land in one aligned
//    128-byte line of shared memory. (A padded row of D + 8 elements puts
//    most of them across two lines; the LSU then splits the request and asks
//    L2 for 1.5x the sectors, measured on the decode kernel under ncu.)
//  - ldmatrix: eight rows read at the same logical chunk hit eight distinct
//    bank groups.
// Rows of 8 or more chunks take whole 128-byte lines (D = 96 is padded to 128
// elements); rows of 4 chunks (D = 32) pair up in one line.
#pragma once

namespace cuflash::detail {

// Elements from one row to the next, for rows of `d` elements.
constexpr int swizzled_pitch(int d) { return d / 8 < 8 ? d : (d + 63) / 64 * 64; }

template <int D>
struct SwizzledRows {
  static_assert(D % 32 == 0, "rows of 4, 8, 12, ... 16-byte chunks");
  static constexpr int kChunks = D / 8;
  // Elements from one row to the next.
  static constexpr int kPitch = swizzled_pitch(D);

  // Element offset of logical chunk `chunk` of row `row`.
  static constexpr int offset(int row, int chunk) {
    if constexpr (kChunks < 8) {
      return row * kPitch + (chunk ^ ((row / 2) & 3)) * 8;
    } else {
      return row * kPitch + ((chunk & ~7) | ((chunk ^ row) & 7)) * 8;
    }
  }
};

}  // namespace cuflash::detail
