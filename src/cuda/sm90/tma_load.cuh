// Device side of the Tensor Memory Accelerator (sm90): one instruction
// copies a box of a tensor described by a CUtensorMap (see tma_map.hpp)
// into shared memory, swizzled as the map says, and reports the bytes it
// wrote to an mbarrier (mbarrier.cuh), so the thread that issues it does no
// address arithmetic and holds no registers for the data.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/tensor_core.cuh"

namespace cuflash::detail::sm90 {

// The map must live in kernel parameter (__grid_constant__), constant or
// global memory; its generic address is what the instruction takes.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<std::uint64_t>(map)) : "memory");
}

// Box at coordinates (c0 innermost .. c3) -> smem_dst, completing `bytes`
// of the transaction count of `bar`. Out-of-bounds elements are zero-filled.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, std::uint64_t* bar, int c0,
                                            int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(sm80::smem_address(smem_dst)),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(sm80::smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) of contiguous
// global memory -> smem_dst, completing that many bytes of `bar`'s
// transaction count (no tensor map: a plain bulk copy).
__device__ __forceinline__ void bulk_load(void* smem_dst, const void* src, std::uint32_t bytes, std::uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          sm80::smem_address(smem_dst)),
      "l"(reinterpret_cast<std::uint64_t>(src)), "r"(bytes), "r"(sm80::smem_address(bar))
      : "memory");
}

}  // namespace cuflash::detail::sm90
