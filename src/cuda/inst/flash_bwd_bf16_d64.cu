// One instantiation of the backward kernels; see sm80/flash_bwd_launch.cuh.
#include "sm80/flash_bwd_launch.cuh"

namespace cuflash::detail::sm80 {
template Status launch_flash_backward<__nv_bfloat16, 64>(const BackwardParams&, int, cudaStream_t);
}  // namespace cuflash::detail::sm80
