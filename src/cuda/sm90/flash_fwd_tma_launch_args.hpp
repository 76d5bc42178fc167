// What the host passes to the TMA forward's launcher beyond the kernel
// parameters (host-only, so the dispatch in flash_forward.cu can fill it
// without seeing the kernel).
#pragma once

#include "sm90/head_rows_tensor.hpp"

namespace cuflash::detail::sm90 {

// q, k, v: the tensors the TMA maps are encoded over, as the plan checked
// them; out: likewise where out_by_tma. persistent_ctas > 0: that many
// CTAs walk the work items (one per SM); 0: one CTA per item, left to the
// hardware's block scheduler. causal_walk: the items differ by their causal
// mask, so a walk deals them out in pairs of equal cost (tile_order.hpp).
// out_by_tma: O leaves through TMA stores (dense, unsplit, mappable output).
// deep_ring: the tile's deep_stages ring (flash_fwd_wgmma_tiles.hpp).
// few_items: the tile's few_items_consumers instead of its consumers.
// short_tiles: the tile's short_block_n key tiles instead of its block_n.
// short_q_buffers: the tile's short_q_buffers Q buffers (TmaFwdConfigQ).
// split_keys: the tile's split-keys kernel (TmaFwdConfigSplitKeys).
struct TmaForwardLaunch {
  HeadRowsTensor q, k, v, out;
  int persistent_ctas = 0;
  bool causal_walk = false;
  bool out_by_tma = false;
  bool deep_ring = false;
  bool few_items = false;
  bool short_tiles = false;
  bool short_q_buffers = false;
  bool split_keys = false;
};

}  // namespace cuflash::detail::sm90
