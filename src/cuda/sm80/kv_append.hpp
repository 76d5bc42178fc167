// The KV-cache append of a forward: k_new/v_new rows written into the cache
// (contiguous or paged) at positions seqlens_k[b] + n, on the caller's stream,
// before the attention kernel reads the cache. Validation has already checked
// that every target slot is inside the cache and that no two sequences write
// the same slot (src/core/validate.cpp); nothing here can fail on contents.
#pragma once

#include <cuda_runtime_api.h>

#include "common/attention_params.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Copies B x new_len x Hk rows of `element_bytes`-sized elements (head_dim of
// them, a multiple of 16 bytes; rows 16-byte aligned, as flash_decode_supports
// requires). Does nothing when p.cache.new_len == 0.
Status launch_kv_append(const AttentionParams& p, int element_bytes, cudaStream_t stream);

}  // namespace cuflash::detail
