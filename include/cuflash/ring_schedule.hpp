// Ring attention's schedule: which local attention calls one ring step makes.
// The one place this rule lives; the NCCL ring (ring.cpp) and the Python ring
// on torch.distributed (cuflash/distributed, through cuflash._ext) both read it.
//
// W ranks each hold `chunks_per_rank` equal chunks of every sequence: one
// (contiguous: rank r holds chunk r of W) or two (zigzag: chunks r and
// 2W-1-r of 2W, in that order, which gives every rank the same causal work).
// At each step a rank attends its queries to the K/V block of `kv_rank`
// (held in the same chunk order). A call covers a run of local query chunks
// and a run of the block's key chunks with the options given in the call:
// blocks no query sees are skipped, blocks every query sees in full run
// unmasked, and the rest run with the global positions' diagonal offset
// (key j aligned with query i when j = i + offset) so that causal masks,
// windows and ALiBi stay exact. Runs of chunks merge into one call where the
// result is the same (dense only: a varlen call covers one chunk).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "cuflash/status.hpp"

namespace cuflash {

enum class RingLayout { contiguous, zigzag };

struct RingMask {
  bool causal = false;
  int window_left = -1, window_right = -1;  // -1: unbounded
  bool alibi = false;                       // ALiBi needs exact positions in every block
};

struct RingCall {
  int q_first = 0, q_count = 0;  // local query chunks [q_first, q_first + q_count)
  int k_first = 0, k_count = 0;  // key chunks of the block held at this step
  bool causal = false;           // the call's options
  int window_left = -1, window_right = -1;
  std::optional<std::int64_t> diagonal_offset;  // none: the default (bottom-right)
};

int ring_chunks_per_rank(RingLayout layout);
// Global index of local chunk `local` of `rank` among world * chunks_per_rank chunks.
int ring_global_chunk(RingLayout layout, int world_size, int rank, int local);

// The calls of the step where `rank` holds the K/V block of `kv_rank`.
// chunk_len: rows per chunk (dense); varlen passes 0, and then only masks
// that need no chunk length are possible (no window, no ALiBi): anything else
// is invalid_argument naming the option.
Status ring_step_calls(RingLayout layout, int world_size, int rank, int kv_rank, const RingMask& mask,
                       bool varlen, std::int64_t chunk_len, std::vector<RingCall>* calls);

}  // namespace cuflash
