// The whole public C++ API.
#pragma once

#include "cuflash/attention.hpp"
#include "cuflash/linear_attention.hpp"
#include "cuflash/merge_states.hpp"
#include "cuflash/options.hpp"
#include "cuflash/ring_schedule.hpp"
#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash {

// "0.1.0"
const char* version();
// Backends compiled into this build and usable on this machine right now
// (cuda needs a visible GPU).
bool backend_available(Backend backend);
// Whether `stream` (a cudaStream_t; nullptr is the default stream) is
// capturing a CUDA graph now; false in a build without CUDA or on a CUDA
// error. For bindings that pass check_index_contents: that check copies index
// tensors to the host, which a capture forbids.
bool stream_capturing(void* stream);

}  // namespace cuflash
