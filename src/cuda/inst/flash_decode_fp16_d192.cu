// One instantiation of the decode kernel; see sm80/flash_decode_launch.cuh.
#include "sm80/flash_decode_launch.cuh"

namespace cuflash::detail::sm80 {
template Status launch_flash_decode<__half, 192>(const ForwardParams&, int, bool, cudaStream_t);
}  // namespace cuflash::detail::sm80
