// The producer's word to the consumers about a work item of the TMA forward:
// the item's block, computed once by the producer (which walks the items
// anyway, ahead of the consumers) instead of by every consumer thread at the
// item boundary, where it sat on the tensor cores' critical path (about 270
// instructions per warp: the walk's and the block's integer divisions).
// One slot per Q buffer, written before the producer's arrival on that
// buffer's q_full barrier, whose release (mbarrier.arrive is .release.cta)
// publishes it with the Q load; `end` marks the end of the CTA's walk.
#pragma once

#include "common/attention_params.hpp"
#include "common/forward_block.cuh"
#include "common/score_mask.cuh"

namespace cuflash::detail::sm90 {

struct alignas(16) WorkItemSlot {
  int b, h, hk, split, m0, rows, t_lo, t_hi;
  int q_start, q_len, k_start, k_len;
  int end;  // 1: no more items (the rest is unset)
  int unused[3];

  __device__ __forceinline__ void publish(const ForwardBlock& f) {
    const int4 words[4] = {{f.b, f.h, f.hk, f.split},
                           {f.m0, f.rows, f.t_lo, f.t_hi},
                           {f.seq.q_start, f.seq.q_len, f.seq.k_start, f.seq.k_len},
                           {0, 0, 0, 0}};
    int4* to = reinterpret_cast<int4*>(this);
#pragma unroll
    for (int i = 0; i < 4; ++i) to[i] = words[i];
  }
  __device__ __forceinline__ void publish_end() { reinterpret_cast<int4*>(this)[3] = make_int4(1, 0, 0, 0); }

  // The slot as four 16-byte loads (every thread reads the same words),
  // then each word broadcast from lane 0: loaded words are per-thread values
  // to the compiler, a shuffle from a fixed lane is known warp-uniform, so
  // the block stays as uniform as the walk's own arithmetic made it. (Its
  // effect on the time was not separable from the machines' variance:
  // NOTES.md, "the producer hands items over".)
  __device__ __forceinline__ WorkItemSlot read() const {
    WorkItemSlot s;
    const int4* from = reinterpret_cast<const int4*>(this);
    int* words = reinterpret_cast<int*>(&s);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int4 w = from[i];
      words[4 * i + 0] = __shfl_sync(0xffffffffu, w.x, 0);
      words[4 * i + 1] = __shfl_sync(0xffffffffu, w.y, 0);
      words[4 * i + 2] = __shfl_sync(0xffffffffu, w.z, 0);
      words[4 * i + 3] = __shfl_sync(0xffffffffu, w.w, 0);
    }
    return s;
  }

  // The block again, its score rules derived here (k_first is 0: the
  // prefill forward has no KV cache, and the masks fold the constant away).
  __device__ __forceinline__ ForwardBlock block(const ForwardParams& p) const {
    ForwardBlock f;
    f.active = true;
    f.b = b, f.h = h, f.hk = hk, f.split = split, f.m0 = m0, f.rows = rows, f.t_lo = t_lo, f.t_hi = t_hi;
    f.seq.q_start = q_start, f.seq.q_len = q_len, f.seq.k_start = k_start, f.seq.k_len = k_len;
    f.rules = score_rules(p, f.seq, b, h);
    return f;
  }
};

}  // namespace cuflash::detail::sm90
