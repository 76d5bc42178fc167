// The chunked linear-attention kernels' shape constants and the rule that
// splits a state walk into segments (linear_chunk_state.cuh), in plain C++:
// the workspace's size depends on it, and tests/cpu checks it without a GPU.
#pragma once

#include <algorithm>
#include <cstdint>

namespace cuflash::detail::linear {

constexpr int kChunk = 64;  // rows of one chunk
constexpr int kSlice = 64;  // columns of Vt (and of the output) of one CTA; a walk's state tile is kSlice x kSlice

// How many segments a walk splits each sequence into (WalkSegments): enough
// for about kWalkTargetCtas CTAs when (Dk/64 x Dv/64) x Hk x B leaves SMs
// idle (two per SM of an H100), none shorter than kMinSegmentChunks chunks
// of the longest sequence, at most kMaxWalkSegments, and 1 rather than 2
// (two segments chain as long as one: half the chunks in each launch, and
// more reads). The walk's time is then 2/segments of the unsplit chain.
// From the problem alone, not the device, so that the workspace's size is a
// function of the problem.
constexpr int kWalkTargetCtas = 256;
constexpr int kMinSegmentChunks = 32;
constexpr int kMaxWalkSegments = 8;

// segments for `ctas` CTAs per segment over `longest` rows: kWalkTargetCtas
// CTAs, segments of at least min_chunks chunks, at most kMaxWalkSegments,
// and at least `fewest` (below it, 1).
constexpr int split_segments(std::int64_t ctas, int longest, int min_chunks, int fewest) {
  const std::int64_t chunks = (static_cast<std::int64_t>(longest) + kChunk - 1) / kChunk;
  std::int64_t segments = ctas > 0 ? kWalkTargetCtas / ctas : 1;
  segments = std::min<std::int64_t>({segments, kMaxWalkSegments, chunks / min_chunks});
  return segments >= fewest ? static_cast<int>(segments) : 1;
}

constexpr int walk_segments(int batch, int heads_kv, int key_dim, int value_dim, int longest) {
  return split_segments(static_cast<std::int64_t>(key_dim / kSlice) * (value_dim / kSlice) * heads_kv * batch, longest,
                        kMinSegmentChunks, 3);
}

// The fused causal forward's segments (linear_chunk_fused.cuh): its CTAs are
// (Dv/64) x Hk x B, each doing a pass's work per chunk as well as the walk's,
// so that a chain of 16 chunks is already long; and 1 rather than 2 (measured
// on the H100 at 4k x 4, 16 heads, 128 x 128: one segment 202 µs, two 168
// plus 56 for the sums' launch).
constexpr int kFusedMinSegmentChunks = 16;
constexpr int fused_forward_segments(int batch, int heads_kv, int value_dim, int longest) {
  return split_segments(static_cast<std::int64_t>(value_dim / kSlice) * heads_kv * batch, longest,
                        kFusedMinSegmentChunks, 3);
}

}  // namespace cuflash::detail::linear
