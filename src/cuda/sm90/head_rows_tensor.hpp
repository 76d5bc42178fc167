// One attention tensor (q, k, v, out or dout) as a TMA map sees it: 2-byte
// elements indexed (innermost first) D, rows, heads, batch with the caller's
// strides; a varlen tensor is one batch of `rows` = total packed rows (batch
// stride 0). The forward and backward plans build these from the problem's views, checks
// them (tma_map.hpp: tma_layout_ok) and hands them to the launch, which
// encodes exactly what was checked.
#pragma once

#include <cstdint>

#include "common/attention_params.hpp"

namespace cuflash::detail {
struct Problem;
}

namespace cuflash::detail::sm90 {

struct HeadRowsTensor {
  const void* base = nullptr;
  std::int64_t batch = 1, rows = 0, heads = 0;
  int head_dim = 0;    // the caller's: box columns past it read as zeros
  RowStrides strides;  // elements
};

// A q/k/v/out/dout view of a dense or varlen problem ([B, S, H, D] or
// [total, H, D]) with `heads` heads, as the maps see it.
HeadRowsTensor head_rows_tensor(const Problem& problem, const TensorView& view, int heads);

}  // namespace cuflash::detail::sm90
