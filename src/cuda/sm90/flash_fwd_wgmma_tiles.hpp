// Tile shapes of the Hopper (wgmma) forward per head dim, shared by the host
// (grid and split-KV decisions) and the kernel instantiations. Head dims
// without an entry (32, 96: not whole 64-element swizzle atoms) use the sm80
// kernel on Hopper too.
#pragma once

#include "common/kernel_table.hpp"
#include "sm80/head_dims.hpp"

namespace cuflash::detail::sm90 {

struct WgmmaFwdTile {
  int block_n;     // keys per tile (query rows per CTA: 128, two warpgroups)
  int stages;      // K/V tiles in flight (loads run stages - 1 tiles ahead)
  int min_blocks;  // CTAs per SM the register budget is sized for
};

// Measured on the H100 (docs/perf/NOTES.md): at D = 64 two CTAs of 64-key
// tiles per SM beat one CTA of 128-key tiles by 15-28 %, the second CTA's
// GEMMs filling the first's softmax and prologue; at D = 128 the 64-key
// variant spills and the 128-key one wins. Three stages instead of two
// measured 1-2 % slower at both (the CTAs per SM already hide the loads).
constexpr WgmmaFwdTile wgmma_fwd_tile(int head_dim) {
  switch (head_dim) {
    case 64: return {64, 2, 2};
    case 128: return {128, 2, 1};
    case 192: return {64, 2, 1};
    case 256: return {64, 2, 1};
    default: return {0, 0, 0};
  }
}

// The warp-specialized TMA forward (sm90/flash_fwd_tma_kernel.cuh): 64 x
// `consumers` query rows per CTA. Measured on the H100 (docs/perf/NOTES.md,
// "Hopper forward, TMA"): D = 64 takes three consumer warpgroups (192 rows;
// +10-14 % over two at 4k-16k keys) but loses to the cp.async kernel's two
// CTAs per SM below `min_keys` when the call is causal or its grid is under
// one wave (H200, session 26: TMA 0.75 / 0.80 of it at 512 / 1k causal and
// 1.03 / 1.04 without a mask on full grids; B = 1, H = 16 took 9.6 / 15.4 us
// on TMA against 9.0 / 15.0 on the cp.async kernel at 128 / 512 keys; two
// consumers were slower everywhere, 0.84-0.96; session 42 on the H200:
// two consumers, walked in pairs, now beat it on dense causal calls, +4.8 /
// +7.6 % at 512 / 1k keys, so forward_plan.cpp gives them those); D = 192 takes 64-key tiles
// and D = 256 80-key ones (O already holds 96-128 registers per thread; at D = 256
// 80 keys measured +5-9 % over 64 at 4k-16k keys, -3-5 % at 512 where 7
// tiles cover 560 keys). 176-key tiles at D = 128 (one Q buffer then)
// measured +3-4 % at 16k and 9-30 % slower up to 2k: not taken.
// The ring: two stages give a key tile's K and V about 1.5 tiles of lead,
// and the consumers waited for K (ncu, session 22). At D = 128 a third
// stage costs the second Q buffer: +5-8 % at 8k-16k keys, +3 % causal at
// 2k-4k, 9 % slower at 512, where the next item's Q then waited for the
// epilogue; so it is taken from `deep_min_keys` on (`deep_stages`; plain
// scores at the kernel's full width only). Since the one Q buffer is
// released before the epilogue (session 32) the deep ring measured
// 0.998-1.012 of two Q buffers at 512-1k keys: left from 2k. D = 64 takes
// four stages (two Q buffers still fit: 161 KiB with two consumers, 177
// with three; one CTA per SM either way): measured on the H200 (session
// 43) +1.3-2.8 % without a mask at 512-4k keys, +1.7 / +0.7 % causal at
// 512 / 1k (its short walk's consumers waited ~a fifth of their time for
// K, V and the next item's Q: ncu), level at 4k (an earlier kernel had
// measured within +-1.5 %). A third Q buffer (D = 64, and D = 128's
// two-stage ring, where it fits in 224 KiB) measured D = 128 causal 512
// +2.8 % but D = 64's three consumers -2 % without a mask and 4k keys
// -1 %: D = 64's two-consumer kernel has it (TmaFwdConfig::QBuffers), and
// D = 128 in calls under short_q_max_keys keys (short_q_buffers: a kernel
// of its own, TmaFwdConfigQ; +2.8 / +0.9 % causal / unmasked at 512 keys
// when measured at every length, session 43).
struct TmaFwdTile {
  int block_n;        // keys per tile; 0: no TMA kernel for this head dim
  int consumers;      // consumer warpgroups of 64 query rows
  int stages;         // K/V tiles in the shared-memory ring
  int min_keys;       // below this many keys the cp.async wgmma kernel is faster for a
                      // call with a right bound (causal) or a grid under one wave
  int deep_stages;    // 0, or a deeper ring for long keys (fewer Q buffers)
  int deep_min_keys;  // the keys from which deep_stages is taken
  // 0, or fewer consumers for a grid of at most one item per SM at that
  // count over more than one key tile (plain scores, the kernel's full
  // width; forward_plan.cpp): more CTAs of fewer rows, whose latency chains
  // run side by side, where min_keys would pick the cp.async kernel (D = 64
  // at B = 1, H = 16: it issued 1.46x cuDNN's instructions there, most of
  // them addressing that TMA does not need; NOTES.md, session 31).
  int few_items_consumers = 0;
  // 0, or narrower key tiles for calls under short_max_keys keys (plain
  // scores, the kernel's full width; forward_plan.cpp): where a wide tile's
  // last one is mostly past the keys (D = 256's 80-key tiles cover 512
  // keys with 560) and its causal diagonal is split unevenly, at lengths
  // where those tiles are a large share of the walk.
  int short_block_n = 0;
  int short_max_keys = 0;
  // 0, or this many Q buffers for calls under short_q_max_keys keys (plain
  // scores, the kernel's full width, the tile's own ring): where items of a
  // few key tiles wait for their Q behind the item before's epilogue.
  int short_q_buffers = 0;
  int short_q_max_keys = 0;
  // 0, or the keys below which grids of few 64-row items over more than one
  // key tile take the split-keys kernel (TmaFwdConfigSplitKeys: two
  // consumers on one block of 64 rows, each taking every other key tile;
  // forward_plan.cpp), with key tiles of split_keys_block_n keys in a ring
  // of split_keys_stages (0: the tile's own): below the keys from which
  // such grids split the keys across CTAs (split-KV, from 16 key tiles)
  // instead. The ring needs two stages per consumer: D = 64 has four;
  // D = 128 takes four stages of 64-key tiles (its own two of 128 keys
  // would give each consumer one).
  int split_keys_max_keys = 0;
  int split_keys_block_n = 0;
  int split_keys_stages = 0;
};

constexpr TmaFwdTile tma_fwd_tile(int head_dim) {
  switch (head_dim) {
    case 64:
      return {.block_n = 128, .consumers = 3, .stages = 4, .min_keys = 2048, .deep_stages = 0, .deep_min_keys = 0,
              .few_items_consumers = 2, .split_keys_max_keys = 2048};
    case 128:
      return {.block_n = 128, .consumers = 2, .stages = 2, .min_keys = 0, .deep_stages = 3, .deep_min_keys = 2048,
              .short_q_buffers = 3, .short_q_max_keys = 2048, .split_keys_max_keys = 1024, .split_keys_block_n = 64,
              .split_keys_stages = 4};
    case 192:
      return {.block_n = 64, .consumers = 2, .stages = 2, .min_keys = 0, .deep_stages = 0, .deep_min_keys = 0};
    case 256:
      return {.block_n = 80, .consumers = 2, .stages = 2, .min_keys = 0, .deep_stages = 0, .deep_min_keys = 0,
              .short_block_n = 64, .short_max_keys = 1024};
    default:
      return {.block_n = 0, .consumers = 0, .stages = 0, .min_keys = 0, .deep_stages = 0, .deep_min_keys = 0};
  }
}

// The split-keys kernel's key tiles and ring (TmaFwdTile::split_keys_*).
constexpr int split_keys_block_n(const TmaFwdTile& tile) {
  return tile.split_keys_block_n > 0 ? tile.split_keys_block_n : tile.block_n;
}
constexpr int split_keys_stages(const TmaFwdTile& tile) {
  return tile.split_keys_stages > 0 ? tile.split_keys_stages : tile.stages;
}

// The TMA kernel's head dim for a caller's head dim (a multiple of 8): the
// smallest one at or above it, 0 when none. TMA zero-fills the box columns
// past the tensor's head dim, so a narrower head dim costs no load; the
// wgmma GEMMs run over tma_columns (below) of the kernel's columns (wgmma's N is the whole
// head dim), which at 80 on the 128 kernel still beats the sm80 kernel at 96
// on an H100 (docs/perf/head-dims.md).
// Head dims up to 32 stay on the sm80 kernel, which has a 32.
constexpr int tma_head_dim(int head_dim) {
  if (head_dim <= 32 || head_dim % sm80::kHeadDimAlign != 0) return 0;
  for (int d : sm80::kHeadDims)
    if (d >= head_dim && tma_fwd_tile(d).block_n > 0) return d;
  return 0;
}

// The columns the TMA kernel computes for a caller's head dim: the smallest
// instantiation of its kernel head dim that holds them (kernel_table's
// kTmaInstances). Narrower instantiations run Q K^T over fewer k-steps and
// P V with a narrower N, so that a head dim of 80 does 80/128 of the 128
// kernel's GEMM work instead of all of it; their columns are multiples of 16
// (whole k-steps), and wgmma takes any N that is a multiple of 8
// (scripts/gen_wgmma.py writes these N).
constexpr int tma_columns(int head_dim) {
  const int kernel = tma_head_dim(head_dim);
  int columns = kernel;
  for (const kernel_table::TmaInstance& t : kernel_table::kTmaInstances)
    if (t.head_dim == kernel && t.columns >= head_dim && t.columns < columns) columns = t.columns;
  return columns;
}

// The tiles above and the instantiations (scripts/gen_kernel_table.py) name
// the same head dims: a kernel with a tile has its instantiations, and every
// instantiation has a tile.
constexpr bool tiles_match_instantiations() {
  for (int d : sm80::kHeadDims) {
    if ((wgmma_fwd_tile(d).block_n > 0) != kernel_table::contains(kernel_table::kWgmmaHeadDims, d)) return false;
    bool full_width = false;
    for (const kernel_table::TmaInstance& t : kernel_table::kTmaInstances) full_width |= t.head_dim == d && t.columns == d;
    if ((tma_fwd_tile(d).block_n > 0) != full_width) return false;
  }
  for (int d : kernel_table::kWgmmaHeadDims)
    if (!kernel_table::contains(sm80::kHeadDims, d)) return false;
  for (const kernel_table::TmaInstance& t : kernel_table::kTmaInstances)
    if (tma_fwd_tile(t.head_dim).block_n == 0 || t.columns % 16 != 0 || t.columns > t.head_dim) return false;
  return true;
}
static_assert(tiles_match_instantiations(), "scripts/gen_kernel_table.py's table and the tiles disagree");

}  // namespace cuflash::detail::sm90
