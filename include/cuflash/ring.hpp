// Ring attention (context parallelism) over NCCL: attention over sequences
// sharded along their length across the ranks of a communicator, exact.
//
// Each rank passes its shard: dense q [B, S_local, Hq, D], k/v [B, S_local,
// Hk, D] (the same S_local: self-attention), or varlen q [T_local, Hq, D],
// k/v [T_local, Hk, D] with cu_seqlens (q and k equal) of the local shards.
// With RingLayout::zigzag rank r holds chunks r and 2W-1-r of 2W equal
// chunks of every sequence, concatenated in that order (balanced causal
// work); with contiguous, chunk r of W. Varlen sequences must divide into
// those chunks (each local length a multiple of 2 for zigzag).
//
// The K/V blocks travel around the ring with ncclSend/ncclRecv on a
// communication stream, double-buffered, while the local steps run on the
// caller's stream with any backend's kernels (options.backend: cuda, or cudnn
// where the steps need no diagonal offset); which calls a step makes comes
// from ring_schedule.hpp. Partial outputs merge exactly in fp32
// (merge_states); the backward rotates K/V again with fp32 dK/dV
// accumulators that travel with their block and come home after W steps.
// Options: scale, causal, window (dense), softcap, ALiBi (dense); no sinks,
// dropout or KV cache. out/lse/dq/dk/dv as in attention_forward/backward of
// the whole sequence, restricted to this rank's rows. docs/ring.md.
//
// Every rank of `comm` must make the same call (same shapes, options and
// layout) on its own device's stream; the call returns once the work is
// enqueued on `context.stream`. Scratch memory comes from
// context.allocator, else cudaMallocAsync on the stream (context.workspace
// is not used).
#pragma once

#include "cuflash/attention.hpp"
#include "cuflash/options.hpp"
#include "cuflash/ring_schedule.hpp"
#include "cuflash/status.hpp"

// NCCL's communicator handle, declared as nccl.h does, so that this header
// does not need NCCL's.
typedef struct ncclComm* ncclComm_t;

namespace cuflash {

struct RingForwardArgs {
  TensorView q, k, v, out;
  TensorView lse;           // optional float32 [B, Hq, S_local] (varlen [Hq, T_local])
  TensorView alibi_slopes;  // optional float32 [Hq] or [B, Hq] (dense)
  TensorView cu_seqlens;    // varlen: int32 [B+1] of the local shards, on the device
  int max_seqlen = 0;       // varlen: longest local shard
};

struct RingBackwardArgs {
  TensorView q, k, v, out, dout;
  TensorView lse;  // float32, as ring_attention_forward wrote it
  TensorView dq, dk, dv;
  TensorView alibi_slopes;
  TensorView cu_seqlens;
  int max_seqlen = 0;
};

// Whether this build has the NCCL ring (else the calls return unsupported).
bool ring_attention_available();

Status ring_attention_forward(const RingForwardArgs& args, const AttentionOptions& options, RingLayout layout,
                              ncclComm_t comm, const RunContext& context = {});
Status ring_attention_backward(const RingBackwardArgs& args, const AttentionOptions& options, RingLayout layout,
                               ncclComm_t comm, const RunContext& context = {});

}  // namespace cuflash
