// A floor for a later wgmma.wait_group: ptxas hoists a wait to the top of
// its basic block, ahead of independent work that the source placed before
// it (the TMA forward's exponentials, which should run under the pending
// P V). ptxas does not move a shared-memory store across the wait (seen in
// the SASS; the wgmmas read shared memory), so a store that needs some
// values holds the work producing them above the wait too. The store never
// happens: it is predicated on `key`'s bits being the all-ones NaN pattern,
// which the caller picks from a value validated finite (the call's scale),
// so ptxas cannot prove the predicate false. Cost: one compare and one
// predicated store.
#pragma once

#include <cstdint>

#include "common/tensor_core.cuh"

namespace cuflash::detail::sm90 {

__device__ __forceinline__ void wgmma_wait_floor(const float (&values)[2], float key, const void* somewhere_shared) {
  asm volatile(
      "{\n .reg .pred never;\n setp.eq.b32 never, %0, -1;\n @never st.shared.v2.f32 [%1], {%2, %3};\n}\n" ::"r"(
          __float_as_uint(key)),
      "r"(smem_address(somewhere_shared)), "f"(values[0]), "f"(values[1])
      : "memory");
}

}  // namespace cuflash::detail::sm90
