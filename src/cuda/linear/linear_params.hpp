// What the linear-attention kernels read from a LinearProblem: base pointers
// and element strides of every view, the geometry and the resolved options, in
// one plain struct passed by value to every kernel (host and device code).
#pragma once

#include <cstdint>

#include "cuflash/linear_attention.hpp"
#include "host_device.hpp"

namespace cuflash::detail::linear {

// A q-like (q, out, dout, dq) or k-like (k, v, dk, dv) tensor: element
// (sequence b, row t, head h, d) lives at
//   dense:  b * batch_stride + t * row_stride + h * head_stride + d
//   varlen: (cu_seqlens[b] + t) * row_stride + h * head_stride + d   (batch_stride 0)
struct RowsView {
  void* data = nullptr;
  std::int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
};

// A state [B, Hk, Dk, Dv] (or key sum [B, Hk, Dk]; row_stride unused) in f32;
// data null when not given.
struct StateView {
  float* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;

  CUFLASH_HOST_DEVICE float* at(int b, int hk, int i) const {
    return data + b * batch_stride + hk * head_stride + i * row_stride;
  }
};

enum class Map : int { identity = 0, elu_plus_one = 1, relu = 2 };

struct LinearParams {
  RowsView q, k, v, out, dout, dq, dk, dv;
  StateView initial_state, initial_key_sum, final_state, final_key_sum;
  StateView dfinal_state, dfinal_key_sum, dinitial_state, dinitial_key_sum;
  const std::int32_t* cu_seqlens = nullptr;  // device; null: dense
  int batch = 0, heads_q = 0, heads_kv = 0, group = 1;
  int key_dim = 0, value_dim = 0;
  int seq_len = 0;  // dense: S; varlen: the longest sequence
  float scale = 1.0f;
  Map map = Map::identity;
  bool causal = true;
  bool normalize = false;
};

// The normalized backward's statistics of one (packed row, query head),
// written by the row_stats pass (linear_chunk_pass.cuh): den_t (the
// normalizer with its eps) and dout_t · num_t in two halves, over value
// columns [0, 64) and [64, 128) (dot[1] unused when Dv = 64), each written by
// the CTA of its slice: no atomics, no order to depend on.
struct alignas(16) RowStats {
  float den;
  float dot[2];
  float unused;
};

// The workspace of the chunked tensor-core kernels (laid out by
// linear_chunk_launch.cuh). The state walk (linear_chunk_state.cuh) writes
// one record per chunk: the state at the chunk's start (the gradient state
// at its end) in the input's 16-bit type, which is what the pass's tensor
// cores read, and with normalize the key sum in fp32. Non-causal, the
// record of a sequence's chunk 0 holds its total instead.
struct ChunkWorkspace {
  void* states;         // [slots][Hk][Dk][Dv], 16-bit
  float* key_sums;      // [slots][Hk][Dk]: normalize
  RowStats* row_stats;  // [packed rows][Hq]: the backward with normalize
  // A split walk's segment sums (WalkSegments): [B][segments][Hk][Dk][Dv]
  // and, with normalize, [B][segments][Hk][Dk]; fp32, unused when not split.
  float* segment_sums;
  float* segment_key_sums;
};

// One walk over the chunks of each sequence: where the running sum starts
// (a state and key sum, 0 when not given), where its total goes (when
// given), and its direction (reverse: the gradient states, which flow from
// the sequence's end).
struct WalkEnds {
  StateView start_state, start_key_sum;
  StateView total_state, total_key_sum;
  bool reverse = false;
};

// A walk split into `count` segments of each sequence's chunks, for grids
// that would leave SMs idle (the walk is a chain: its time is its length).
// Two launches: the first (sums_only) walks every segment from 0 at once
// and keeps only its sum; the second starts each segment from the walk's
// start plus the sums of the segments before it, and stores the records.
// count 1: one launch, the plain walk.
struct WalkSegments {
  int count = 1;
  bool sums_only = false;
};

#ifdef __CUDACC__

// First packed row and length of sequence b.
struct SequenceSpan {
  std::int64_t first;  // varlen: cu_seqlens[b]; dense: 0 (the batch stride carries b)
  int length;
};
__device__ __forceinline__ SequenceSpan sequence_span(const LinearParams& p, int b) {
  if (p.cu_seqlens == nullptr) return {0, p.seq_len};
  const int first = p.cu_seqlens[b];
  return {first, p.cu_seqlens[b + 1] - first};
}

// Index of row t of sequence b among the packed rows (dense: b * S + t): of
// the per-row workspaces of the backward.
__device__ __forceinline__ std::int64_t packed_row(const LinearParams& p, int b, const SequenceSpan& span, int t) {
  return (p.cu_seqlens ? span.first : static_cast<std::int64_t>(b) * p.seq_len) + t;
}

// Element 0 of row t of head h of sequence b.
template <typename T>
__device__ __forceinline__ T* row_pointer(const RowsView& view, int b, const SequenceSpan& span, int t, int h) {
  return static_cast<T*>(view.data) + b * view.batch_stride + (span.first + t) * view.row_stride + h * view.head_stride;
}

__device__ __forceinline__ float feature(Map map, float x) {
  switch (map) {
    case Map::elu_plus_one: return x > 0.0f ? x + 1.0f : expf(x);
    case Map::relu: return x > 0.0f ? x : 0.0f;
    default: return x;
  }
}

// dφ/dx with torch's convention at 0 (relu' = 0, (elu+1)' = 1).
__device__ __forceinline__ float feature_derivative(Map map, float x) {
  switch (map) {
    case Map::elu_plus_one: return x > 0.0f ? 1.0f : expf(x);
    case Map::relu: return x > 0.0f ? 1.0f : 0.0f;
    default: return 1.0f;
  }
}

#endif

}  // namespace cuflash::detail::linear
