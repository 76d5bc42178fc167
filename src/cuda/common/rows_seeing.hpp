// Which query rows of a sequence see a block of keys: the backward kernels
// walk those rows for a block (sm80/flash_bwd_kernel.cuh, the Hopper
// backward's walk, sm90/bwd_walk.hpp). Host and device, so that the walks
// and the deterministic order built on them are tested on the host
// (tests/cpu/bwd_walk_test.cpp); score_mask.cuh builds it from a call.
#pragma once

#include <cstdint>

#include "host_device.hpp"

namespace cuflash::detail {

// One sequence's visibility: key j is aligned with row i at j = i + offset;
// a row sees the keys [i + offset - window_left, i + offset + window_right]
// (-1: unbounded on that side).
struct KeyVisibility {
  std::int64_t offset = 0;
  int q_len = 0;
  int window_left = -1, window_right = -1;
};

// Sequence-relative row range [lo, hi) of the queries that see some key of
// [n0, n1) (n1 <= k_len); 64-bit so that huge windows cannot overflow.
CUFLASH_HOST_DEVICE void query_rows_seeing(const KeyVisibility& v, int n0, int n1, std::int64_t* lo,
                                           std::int64_t* hi) {
  std::int64_t l = 0, h = v.q_len;
#if defined(__CUDA_ARCH__)  // (the device's min/max, as the kernels compiled before this was shared)
  if (v.window_right >= 0) l = max(l, static_cast<std::int64_t>(n0) - v.offset - v.window_right);
  if (v.window_left >= 0) h = min(h, static_cast<std::int64_t>(n1) - v.offset + v.window_left);
#else
  if (v.window_right >= 0) {
    const std::int64_t first = static_cast<std::int64_t>(n0) - v.offset - v.window_right;
    l = first > l ? first : l;
  }
  if (v.window_left >= 0) {
    const std::int64_t end = static_cast<std::int64_t>(n1) - v.offset + v.window_left;
    h = end < h ? end : h;
  }
#endif
  *lo = l;
  *hi = h;
}

}  // namespace cuflash::detail
