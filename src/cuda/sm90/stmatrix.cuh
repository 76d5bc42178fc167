// stmatrix (sm90): a warp stores four 8x8 matrices of 16-bit elements from
// the mma.sync accumulator-fragment layout (lane l holds row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1 of each, packed in one register per matrix)
// to shared memory: stored row r of matrix m, 8 consecutive elements (16
// bytes), at the address lane 8 m + r gives; as held (stmatrix_x4) or
// transposed (stmatrix_x4_trans: stored row r is the matrix's column r).
// One instruction instead of 32 two-byte stores per lane.
#pragma once

#include <cstdint>

#include "common/tensor_core.cuh"

namespace cuflash::detail::sm90 {

__device__ __forceinline__ void stmatrix_x4(void* row_address, const std::uint32_t (&m)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   sm80::smem_address(row_address)),
               "r"(m[0]), "r"(m[1]), "r"(m[2]), "r"(m[3])
               : "memory");
}

__device__ __forceinline__ void stmatrix_x4_trans(void* row_address, const std::uint32_t (&m)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                   sm80::smem_address(row_address)),
               "r"(m[0]), "r"(m[1]), "r"(m[2]), "r"(m[3])
               : "memory");
}

}  // namespace cuflash::detail::sm90
