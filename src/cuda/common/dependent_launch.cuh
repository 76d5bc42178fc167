// Programmatic dependent launch (sm90+): a kernel that consumes what the
// previous kernel in the stream wrote (the split-KV combine after the decode
// kernel) is launched so that its CTAs are scheduled while that kernel still
// runs, and wait on the device instead of behind a full launch gap. Measured
// on an H100 (docs/perf/NOTES.md): decode with splits 2-4% faster at batch
// 1-8, where the combine's launch was a visible share of a 20-70 us call.
#pragma once

#include <cuda_runtime_api.h>

#include <utility>

#include "common/cuda_check.hpp"
#include "common/device_info.hpp"

namespace cuflash::detail {

// In the producer: lets the stream's next kernel, when launched with
// launch_dependent, start its CTAs now. Its reads still wait for this whole
// grid (wait_for_producer_grid), so where this is called does not matter for
// correctness, only for how early the dependent's CTAs take SM slots.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// In the consumer, before its first read of the producer's output: waits
// until the previous grid has finished and its writes are visible. Returns
// at once when the kernel was launched the ordinary way.
__device__ __forceinline__ void wait_for_producer_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, 0, stream>>>(args...) as a programmatic
// dependent of the stream's previous kernel on GPUs that support it (compute
// capability 9.0+), the ordinary way elsewhere. The kernel must call
// wait_for_producer_grid() before it reads what that kernel wrote.
template <typename... Params, typename... Args>
Status launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, const char* name,
                        Args&&... args) {
  int device = 0;
  CUFLASH_TRY(cuda_status(cudaGetDevice(&device), "cudaGetDevice"));
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = 0;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = device_info(device).major >= 9 ? 1 : 0;
  return cuda_status(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), name);
}

}  // namespace cuflash::detail
