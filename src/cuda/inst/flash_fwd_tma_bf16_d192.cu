// One instantiation of the TMA forward; see sm90/flash_fwd_tma_launch.cuh.
#include "sm90/flash_fwd_tma_launch.cuh"

namespace cuflash::detail::sm90 {
template Status launch_flash_fwd_tma<__nv_bfloat16, 192, 192>(const ForwardParams&, const TmaForwardLaunch&, cudaStream_t);
}  // namespace cuflash::detail::sm90
