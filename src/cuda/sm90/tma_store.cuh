// Device side of TMA stores (sm90): one instruction copies a box of shared
// memory, laid out (swizzled) as the CUtensorMap says, to global memory;
// elements outside the tensor are not written. Stores are bulk async
// operations: a thread commits the ones it issued as a group and waits
// until a group has finished *reading* shared memory before that memory
// is written again (or the CTA exits).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "common/tensor_core.cuh"

namespace cuflash::detail::sm90 {

// smem_src -> the box at coordinates (c0 innermost .. c3). The shared-memory
// writes it reads must be made visible to the async proxy first
// (fence.proxy.async.shared::cta by each writing thread, then a barrier).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int c0, int c1, int c2,
                                             int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
          reinterpret_cast<std::uint64_t>(map)),
      "r"(sm80::smem_address(smem_src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// dst[0 .. bytes/4) += smem_src[0 .. bytes/4) in fp32, element by element,
// atomically with respect to other reductions (a bulk reduction: one
// instruction, no per-thread atomics). `bytes` a multiple of 16, both
// addresses 16-byte aligned; a bulk_group operation like the stores.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const float* smem_src, std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<std::uint64_t>(dst)),
               "r"(sm80::smem_address(smem_src)), "r"(bytes)
               : "memory");
}

// Closes the group of bulk operations this thread issued since the last commit.
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most `Pending` of this thread's committed groups still read
// shared memory.
template <int Pending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}
// Waits until at most `Pending` of them are incomplete (their global
// writes done), e.g. before the CTA exits.
template <int Pending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(Pending) : "memory");
}

}  // namespace cuflash::detail::sm90
