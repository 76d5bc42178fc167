// What the host passes to the TMA forward's launcher beyond the kernel
// parameters (host-only, so the dispatch in sm80/flash_fwd.cu can fill it
// without seeing the kernel).
#pragma once

#include <cstdint>

namespace cuflash::detail::sm90 {

// q_rows, kv_rows: the row extents of the tensors for the TMA maps (dense:
// rows per sequence; varlen: packed rows). persistent_ctas > 0: that many
// CTAs walk the work items (one per SM); 0: one CTA per item, left to the
// hardware's block scheduler. causal_walk: the items differ by their causal
// mask, so a walk deals them out in pairs of equal cost (tile_order.hpp).
// out_by_tma: O leaves through TMA stores (dense, unsplit, mappable output).
struct TmaForwardLaunch {
  std::int64_t q_rows = 0, kv_rows = 0;
  int persistent_ctas = 0;
  bool causal_walk = false;
  bool out_by_tma = false;
};

}  // namespace cuflash::detail::sm90
