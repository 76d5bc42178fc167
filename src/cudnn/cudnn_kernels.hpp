// The small kernels around a cuDNN call: the index tensors cuDNN reads
// (per-sequence lengths, ragged offsets) computed from cu_seqlens on the
// device, and the fix-ups that make its results our semantics (stats copied
// to and from our lse layout; rows that see no key: out = 0, lse = -inf,
// dq = 0; keys no query sees: dk = dv = 0). Everything is addressed through
// strides, so any view the API accepts works.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuflash/status.hpp"
#include "sdpa_plan.hpp"

namespace cuflash::detail::cudnn {

// Per-sequence lengths as the device sees them: varlen from cu_seqlens, a KV
// cache's keys from seqlens_k, otherwise the same constant for every sequence.
struct DeviceLengths {
  const std::int32_t* cu_q = nullptr;
  const std::int32_t* cu_kv = nullptr;
  const std::int32_t* seqlens_kv = nullptr;
  int q_len = 0, kv_len = 0;
};

// Rows (b, h, i) of a tensor: element offset b * batch_stride + h * head_stride
// + i * row_stride, or for a packed (varlen) tensor h * head_stride +
// (cu_seqlens[b] + i) * row_stride.
struct RowView {
  void* data = nullptr;
  std::int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
  bool packed = false;
};

// One side of the rows to visit: B sequences of rows_per_sequence rows
// (dense), or the packed rows 0 .. total_rows-1 (varlen, located through
// cu_seqlens). heads: query heads on the q side, KV heads on the kv side.
struct RowSpace {
  int batch = 0, heads = 0;
  bool packed = false;
  std::int64_t rows_per_sequence = 0;  // dense
  std::int64_t total_rows = 0;         // packed
};

struct IndexArgs {
  int batch = 0;
  DeviceLengths lengths;
  std::int32_t* q_lengths = nullptr;   // [B] = q_len(b), or nullptr
  std::int32_t* kv_lengths = nullptr;  // [B] = kv_len(b), or nullptr
  // [B + 1] = cu_seqlens(side)[b] * token_stride, per ragged tensor.
  struct Offsets {
    std::int64_t* out = nullptr;
    std::int64_t token_stride = 0;
    Side side = Side::q;
  } offsets[kSlots];
  int offset_count = 0;
};
Status launch_index_kernel(const IndexArgs& args, cudaStream_t stream);

struct ForwardFixArgs {
  RowSpace rows;
  DeviceLengths lengths;
  int window_right = -1;
  int head_dim = 0;
  bool fix_empty_rows = false;  // out = 0 and lse = -inf where a row sees no key
  RowView out;                  // 16-bit elements
  RowView lse;                  // float; data nullptr: no lse
  RowView stats;                // float, cuDNN's stats in scratch to copy into lse; data nullptr: none
};
Status launch_forward_fix(const ForwardFixArgs& args, cudaStream_t stream);

// The backward's stats: lse copied into cuDNN's layout, -inf (a row that sees
// no key) turned into +inf so that cuDNN's P = exp(s - stats) is 0, not NaN.
struct BackwardStatsArgs {
  RowSpace rows;
  DeviceLengths lengths;
  RowView lse;    // float, the caller's
  RowView stats;  // float, scratch
};
Status launch_backward_stats(const BackwardStatsArgs& args, cudaStream_t stream);

// After the backward: dq = 0 on rows that see no key (q side), dk = dv = 0 on
// keys that no query sees (kv side).
struct BackwardFixArgs {
  RowSpace rows;
  DeviceLengths lengths;
  Side side = Side::q;
  int window_left = -1, window_right = -1;
  int head_dim = 0;
  RowView first, second;  // q side: dq (second unused); kv side: dk, dv
};
Status launch_backward_fix(const BackwardFixArgs& args, cudaStream_t stream);

}  // namespace cuflash::detail::cudnn
