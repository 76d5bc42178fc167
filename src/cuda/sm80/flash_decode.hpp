// Host entry of the KV-cache forward of backend=cuda (fp16/bf16, mma.sync,
// sm80+): queries of one or more tokens per sequence against a contiguous or
// paged cache, with the optional append of k_new/v_new first. Decode,
// speculative decode and chunked prefill all take this path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// ok, or `unsupported` with the reason (dtype, head dim, page size, alignment, GPU).
Status flash_decode_supports(const Problem& problem);
// Scratch bytes (split-KV partial outputs). Sized for the longest cache the
// call's shapes allow (its capacity, or the window), not the lengths of this
// call, so that one query serves a whole decode loop as the caches grow.
std::size_t flash_decode_workspace_bytes(const Problem& problem);
// Append (when new_len > 0), then attention, then the split combine; all on `stream`.
Status flash_decode(const Problem& problem, void* workspace, cudaStream_t stream);

}  // namespace cuflash::detail
