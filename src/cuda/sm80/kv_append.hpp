// The KV-cache append of a forward: k_new/v_new rows written into the cache
// (contiguous or paged) at positions seqlens_k[b] + n (k_new rotated at those
// positions when the call has a rotary embedding), on the caller's stream,
// before the attention kernel reads the cache. Validation has already checked
// that every target slot is inside the cache and that no two sequences write
// the same slot (src/core/validate.cpp); nothing here can fail on contents.
#pragma once

#include <cuda_runtime_api.h>

#include "common/attention_params.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Copies B x new_len x Hk rows of T (__half or __nv_bfloat16; head_dim of
// them, a multiple of 16 bytes; rows 16-byte aligned, as flash_decode_supports
// requires), the k rows rotated when p.cache.rotary is given. Does nothing
// when p.cache.new_len == 0.
template <typename T>
Status launch_kv_append(const AttentionParams& p, cudaStream_t stream);

}  // namespace cuflash::detail
