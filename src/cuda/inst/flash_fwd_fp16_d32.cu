// One instantiation of the forward kernel; see sm80/flash_fwd_launch.cuh.
#include "sm80/flash_fwd_launch.cuh"

namespace cuflash::detail::sm80 {
template Status launch_flash_fwd<__half, 32>(const ForwardParams&, cudaStream_t);
}  // namespace cuflash::detail::sm80
