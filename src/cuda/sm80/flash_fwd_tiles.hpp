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
  // Wait for the V tile before the softmax rather than after it, so that the
  // exponentials and P V's products form one stretch of code the compiler
  // overlaps; costs registers, so only where it measured faster without
  // spills (D=64; at 32/96/128 it spills).
  bool v_wait_before_softmax;
};

constexpr FwdTile fwd_tile(int head_dim) {
  switch (head_dim) {
    case 32: return {128, 128, 4, true, 2, false};
    case 64: return {128, 64, 4, true, 2, true};
    case 96: return {128, 64, 4, false, 2, false};
    case 128: return {128, 64, 4, false, 2, false};
    case 192: return {128, 64, 8, false, 1, false};
    case 256: return {128, 64, 8, false, 1, false};
    default: return {0, 0, 0, false, 0, false};
  }
}

}  // namespace cuflash::detail::sm80
