// One instantiation of the TMA forward (kernel head dim 128, 96 columns
// computed: sm90::tma_columns); see sm90/flash_fwd_tma_launch.cuh.
#include "sm90/flash_fwd_tma_launch.cuh"

namespace cuflash::detail::sm90 {
template Status launch_flash_fwd_tma<__half, 128, 96>(const ForwardParams&, const TmaForwardLaunch&, cudaStream_t);
}  // namespace cuflash::detail::sm90
