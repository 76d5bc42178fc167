// One instantiation of the TMA backward; see sm90/flash_bwd_tma_launch.cuh.
#include "sm90/flash_bwd_tma_launch.cuh"

namespace cuflash::detail::sm90 {
template Status launch_flash_bwd_tma<__half, 256>(const BackwardParams&, const TmaBackwardLaunch&, void*, cudaStream_t);
}  // namespace cuflash::detail::sm90
