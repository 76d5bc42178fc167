// Loads and stores of one element of f32/f16/bf16 as float, for kernels that
// are templated on the storage type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace cuflash::detail {

__device__ __forceinline__ float load_float(const float* p) { return *p; }
__device__ __forceinline__ float load_float(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_float(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ void store_float(float* p, float value) { *p = value; }
__device__ __forceinline__ void store_float(__half* p, float value) { *p = __float2half_rn(value); }
__device__ __forceinline__ void store_float(__nv_bfloat16* p, float value) { *p = __float2bfloat16_rn(value); }

}  // namespace cuflash::detail
