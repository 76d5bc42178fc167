// The rules that split the chunked linear-attention state walk and the fused
// causal forward into segments (src/cuda/linear/linear_walk_segments.hpp),
// without a GPU: the benchmark's shapes, the GPU split-walk test's shapes (so
// that LinearGpuSplitWalk really runs 3, 4 and 8 walk segments, 6 and 8
// fused ones), and the edges.
#include <gtest/gtest.h>

#include "linear/linear_walk_segments.hpp"

namespace cuflash::detail::linear {
namespace {

TEST(LinearWalkSegments, BenchmarkShapes) {
  // H = 16, D = 128: 4 state tiles per head, 64 CTAs per sequence.
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 1 << 20), 4);  // 256 / 64
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 65536), 4);
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 16384), 4);
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 8192), 4);   // 128 chunks: 4 of 32
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 4096), 1);   // 64 chunks: 2 would chain as long as 1
  EXPECT_EQ(walk_segments(2, 16, 128, 128, 8192), 1);   // 128 CTAs: 2 segments, so none
  EXPECT_EQ(walk_segments(4, 16, 128, 128, 4096), 1);   // 256 CTAs fill the GPU
}

TEST(LinearWalkSegments, GpuSplitTestShapes) {
  // Dk 64, Dv 128, 2 kv heads: 4 CTAs per sequence.
  EXPECT_EQ(walk_segments(1, 2, 64, 128, 8229), 4);   // 129 chunks / 32
  EXPECT_EQ(walk_segments(1, 2, 64, 128, 16384), 8);  // capped at kMaxWalkSegments
  EXPECT_EQ(walk_segments(4, 2, 64, 128, 6200), 3);   // varlen, longest 6200: 97 chunks / 32
  // The GPU matrix's lengths (at most 600 rows) never split.
  EXPECT_EQ(walk_segments(2, 2, 64, 128, 600), 1);
}

TEST(LinearWalkSegments, Edges) {
  EXPECT_EQ(walk_segments(0, 16, 128, 128, 65536), 1);  // no CTAs
  EXPECT_EQ(walk_segments(1, 16, 128, 128, 0), 1);      // no rows
  EXPECT_EQ(walk_segments(1, 1, 64, 64, 1 << 20), kMaxWalkSegments);
  EXPECT_EQ(walk_segments(1, 1, 64, 64, 3 * kMinSegmentChunks * kChunk), 3);
  EXPECT_EQ(walk_segments(1, 1, 64, 64, (3 * kMinSegmentChunks - 1) * kChunk), 1);  // 95 chunks: 2 segments, so none
  static_assert(walk_segments(1, 16, 128, 128, 65536) == 4, "a constant expression: usable for sizes");
}

TEST(LinearFusedForwardSegments, BenchmarkShapes) {
  // H = 16, Dv = 128: 2 CTAs per head, 32 per sequence.
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 1 << 20), 8);  // 256 / 32
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 65536), 8);
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 16384), 8);   // 256 chunks: 8 of 32
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 4096), 4);    // 64 chunks: 4 of 16
  EXPECT_EQ(fused_forward_segments(2, 16, 128, 8192), 4);    // 64 CTAs
  EXPECT_EQ(fused_forward_segments(4, 16, 128, 4096), 1);    // 128 CTAs: 2 segments, so none
  EXPECT_EQ(fused_forward_segments(8, 16, 128, 2048), 1);    // 256 CTAs fill the GPU
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 1024), 1);    // 16 chunks: one segment
}

TEST(LinearFusedForwardSegments, GpuSplitTestShapes) {
  // Dv 128, 2 kv heads: 4 CTAs per sequence.
  EXPECT_EQ(fused_forward_segments(1, 2, 128, 8229), 8);   // 129 chunks, capped at kMaxWalkSegments
  EXPECT_EQ(fused_forward_segments(1, 2, 128, 16384), 8);
  EXPECT_EQ(fused_forward_segments(4, 2, 128, 6200), 6);   // varlen, longest 6200: 97 chunks / 16
  // The GPU matrix's lengths (at most 600 rows: 10 chunks) never split.
  EXPECT_EQ(fused_forward_segments(2, 2, 128, 600), 1);
  EXPECT_EQ(fused_forward_segments(2, 2, 64, 600), 1);
}

TEST(LinearFusedForwardSegments, Edges) {
  EXPECT_EQ(fused_forward_segments(0, 16, 128, 65536), 1);  // no CTAs
  EXPECT_EQ(fused_forward_segments(1, 16, 128, 0), 1);      // no rows
  EXPECT_EQ(fused_forward_segments(1, 1, 64, 3 * kFusedMinSegmentChunks * kChunk), 3);
  EXPECT_EQ(fused_forward_segments(1, 1, 64, (3 * kFusedMinSegmentChunks - 1) * kChunk), 1);  // 2 segments, so none
  static_assert(fused_forward_segments(1, 16, 128, 65536) == 8, "a constant expression: usable for sizes");
}

}  // namespace
}  // namespace cuflash::detail::linear
