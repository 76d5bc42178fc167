// Warpgroup-level control on sm90: register reallocation between the
// producer and consumer warpgroups of a warp-specialized kernel, and named
// barriers (bar.sync / bar.arrive with an id and a thread count) for
// synchronizing some warpgroups without the whole CTA.
#pragma once

namespace cuflash::detail::sm90 {

// Every warp of the warpgroup must execute these (.sync.aligned). The
// producer gives registers back so the consumers can take more; the counts
// must be multiples of 8 in [24, 256].
template <int Registers>
__device__ __forceinline__ void warpgroup_registers_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Registers));
}
template <int Registers>
__device__ __forceinline__ void warpgroup_registers_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Registers));
}

// Named barrier `id` (1..15; 0 is __syncthreads) completing when `threads`
// threads (a multiple of 32) have reached it; sync blocks, arrive does not.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads));
}

}  // namespace cuflash::detail::sm90
