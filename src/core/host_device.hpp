// CUFLASH_HOST_DEVICE: a function that host and device code both call (the
// rules the CPU reference and the kernels share). Under nvcc it is compiled
// for both sides and inlined; under a host compiler (the library builds
// without CUDA too) it is a plain inline function.
#pragma once

#if defined(__CUDACC__)
#define CUFLASH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define CUFLASH_HOST_DEVICE inline
#endif
