// Shared-memory mbarriers (sm90): the handshake between the producer warp
// that issues TMA loads and the consumer warpgroups that read the tiles.
//
// A "full" barrier per stage counts one producer arrival plus the bytes the
// TMA unit still has to write (expect_tx); it completes when both are in.
// An "empty" barrier counts the consumer threads that have finished reading
// the stage. Waits are on the phase parity: a barrier starts in phase 0, so
// the first wait of a consumer is on parity 0 and the first wait of the
// producer on an empty barrier is on parity 1 (the phase "before" the first,
// which counts as complete).
#pragma once

#include <cstdint>

#include "common/tensor_core.cuh"

namespace cuflash::detail::sm90 {

__device__ __forceinline__ void mbarrier_init(std::uint64_t* bar, std::uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm80::smem_address(bar)), "r"(arrivals) : "memory");
}

// Makes the initialized barriers visible to the other threads and to the
// async proxy (TMA) before anyone uses them; follow with a CTA barrier.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer's arrival announcing `bytes` of TMA writes to come.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(std::uint64_t* bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm80::smem_address(bar)),
               "r"(bytes)
               : "memory");
}

// A plain arrival (a consumer thread releasing a stage).
__device__ __forceinline__ void mbarrier_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm80::smem_address(bar)) : "memory");
}

// Blocks until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbarrier_wait(std::uint64_t* bar, std::uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_again;\n"
      "}\n" ::"r"(sm80::smem_address(bar)),
      "r"(parity)
      : "memory");
}

}  // namespace cuflash::detail::sm90
