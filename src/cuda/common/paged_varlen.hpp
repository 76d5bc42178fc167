// A varlen forward whose keys are in a paged cache (Problem::paged_varlen(),
// flash-attn's paged prefill) runs as the packed varlen forward: one kernel
// copies each sequence's keys and values, through its block-table row, into
// packed [rows, Hk, D] buffers at the start of the call's workspace, in the
// order packed keys would have (row cu_seqlens_k[b] + j is key j of sequence
// b); the varlen kernels then run unchanged on those buffers with the
// caller's cu_seqlens_k. It is the same function as the call with the keys
// packed, bit for bit: only where the keys come from differs.
//
// What it costs: the copy reads and writes every key and value once, O(keys
// x Hk x D) bytes, against the attention's O(q_len x kv_len x Hq x D) work
// per sequence; beside a prefill chunk of more than a few queries it is a
// small share (a decode step, one query per sequence, takes the KV-cache
// layout and its decode kernel instead). A forward that read the pages
// itself would save the copy and its workspace, at the price of a paged
// loader in every prefill kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuflash/status.hpp"
#include "problem.hpp"

namespace cuflash::detail {

// What backend cuda adds to validation for a paged varlen call: the page
// size its page addressing takes (cuda_page_size_supported, as for KV caches).
Status paged_varlen_supports(const Problem& problem);

// Bytes of workspace the packed K and V take, a multiple of 256. Rows:
// cu_seqlens_k[B] when the host has it (check_index_contents), else the bound
// batch x max_seqlen_k, which a workspace query (made without index contents)
// answers, so the query covers the call.
std::size_t packed_keys_bytes(const Problem& problem);

// The packed varlen problem the kernels run: `problem` with k and v replaced
// by the packed buffers at `workspace` (no pages). Before a workspace exists
// (supports, workspace size) pass nullptr: the views then point at a
// stand-in address aligned as workspace regions are, which is all the
// kernels' choices look at.
Problem packed_keys_problem(const Problem& problem, void* workspace);

// Fills the packed buffers of `packed` (from packed_keys_problem with the
// real workspace) from the pages of `problem`, on `stream`. The workspace
// must be 16-byte aligned (invalid_argument otherwise). Bad indices (only
// possible with check_index_contents off) never leave the tensors: a page
// outside the cache, or a key past the block-table row, reads as zeros.
Status gather_paged_keys(const Problem& problem, const Problem& packed, cudaStream_t stream);

}  // namespace cuflash::detail
