// Tile shapes of the forward kernel per head dim, shared by the host (grid
// and split-KV decisions) and the kernel instantiations, so the two agree.
#pragma once

namespace cuflash::detail::sm80 {

struct FwdTile {
  int block_m;    // query rows per CTA
  int block_n;    // keys per tile
  int warps;
  bool q_in_regs;  // Q fragments held in registers across key tiles
  int min_blocks;  // CTAs per SM the register budget is sized for
};

constexpr FwdTile fwd_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {128, 128, 4, true, 2};
    case 64: return {128, 64, 4, true, 2};
    case 96: return {128, 64, 4, false, 2};
    case 128: return {128, 64, 4, false, 2};
    case 192: return {128, 64, 8, false, 1};
    case 256: return {128, 64, 8, false, 1};
    default: return {0, 0, 0, false, 0};
  }
}

}  // namespace cuflash::detail::sm80
