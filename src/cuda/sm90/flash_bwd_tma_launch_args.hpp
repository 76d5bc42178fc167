// What the host passes to the TMA backward's launcher beyond the kernel
// parameters, and the workspace it needs (host-only: the backward plan
// reads it without seeing the kernel).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/scratch.hpp"
#include "sm90/bwd_row_tiles.hpp"
#include "sm90/head_rows_tensor.hpp"

namespace cuflash::detail::sm90 {

// The tensors the TMA maps are encoded over, as the plan checked them, and
// the launch order of the key blocks (sm90/bwd_chain_order.hpp: chains
// interleaved in deterministic calls without a right bound; 1: the grid's).
struct TmaBackwardLaunch {
  HeadRowsTensor q, k, v, dout;
  int chain_interleave = 1;
};

// Workspace, in this order: the dQ accumulator [heads_q][padded rows][D]
// (fp32), then the rows' base-2 lse and dsum [heads_q][padded rows] each
// (sm90/bwd_row_tiles.hpp), then for deterministic calls a turn counter
// (uint32) per 64-row dQ tile; each part 256-byte aligned.
struct TmaBackwardWorkspace {
  std::size_t dq_accum = 0, lse2 = 0, dsum = 0, dq_turn = 0;  // offsets
  std::size_t bytes = 0;
};
inline TmaBackwardWorkspace tma_backward_workspace(std::int64_t total_q_rows, int batch, int heads_q, int head_dim,
                                                   bool deterministic) {
  const std::size_t rows = static_cast<std::size_t>(bwd_padded_rows(total_q_rows, batch)) * heads_q;
  TmaBackwardWorkspace w;
  w.lse2 = align256(rows * head_dim * sizeof(float));
  w.dsum = w.lse2 + align256(rows * sizeof(float));
  w.dq_turn = w.dsum + align256(rows * sizeof(float));
  w.bytes = w.dq_turn + (deterministic ? align256(rows / kBwdTileRows * sizeof(std::uint32_t)) : 0);
  return w;
}

}  // namespace cuflash::detail::sm90
