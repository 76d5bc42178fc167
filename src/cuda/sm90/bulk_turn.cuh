// Turns between CTAs for bulk reductions into one global buffer (sm90): a
// counter in global memory says how many CTAs have had their turn; a CTA
// waits for its number, issues its bulk reductions (tma_store.cuh), waits
// until they are complete and passes the turn on. The additions then land in
// one order every run, which makes a sum of floats bitwise reproducible.
//
// Bulk reductions go through the async proxy and the counter through the
// generic one, so each side fences between the two: after the acquire, so
// that the reductions issued next are ordered after it; before the release,
// so that the finished reductions are ordered before it.
#pragma once

#include <cstdint>

namespace cuflash::detail::sm90 {

// Spins (one thread) until *turn == mine, with acquire semantics at gpu scope.
__device__ __forceinline__ void bulk_turn_wait(const std::uint32_t* turn, std::uint32_t mine) {
  std::uint32_t seen;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(turn) : "memory");
    if (seen == mine) break;
    __nanosleep(32);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// After this thread's bulk reductions are complete (bulk_wait_group<0>):
// the next CTA's turn.
__device__ __forceinline__ void bulk_turn_pass(std::uint32_t* turn) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(turn) : "memory");
}

}  // namespace cuflash::detail::sm90
