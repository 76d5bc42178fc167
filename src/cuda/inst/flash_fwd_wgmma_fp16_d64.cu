// One instantiation of the Hopper forward; see sm90/flash_fwd_wgmma_launch.cuh.
#include "sm90/flash_fwd_wgmma_launch.cuh"

namespace cuflash::detail::sm90 {
template Status launch_flash_fwd_wgmma<__half, 64>(const ForwardParams&, cudaStream_t);
}  // namespace cuflash::detail::sm90
