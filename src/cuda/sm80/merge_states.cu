#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/element_io.cuh"
#include "softmax_merge.hpp"
#include "sm80/merge_states.cuh"

namespace cuflash::detail {

namespace {

// Strides of one [B, S, H, D] output and its [B, H, S] lse, in elements.
struct RowAddressing {
  std::int64_t out_batch, out_seq, out_head;
  std::int64_t lse_batch, lse_head, lse_seq;
};

RowAddressing addressing_of(const TensorView& out, const TensorView& lse) {
  return {out.strides[0], out.strides[1], out.strides[2], lse.strides[0], lse.strides[1], lse.strides[2]};
}

struct MergeParams {
  const void* out_a;
  const float* lse_a;
  const void* out_b;
  const float* lse_b;
  void* out;
  float* lse;
  RowAddressing a, b, merged;
  int seq_len, heads, head_dim;
  std::int64_t rows;  // batch * seq_len * heads
};

__device__ __forceinline__ std::int64_t out_offset(const RowAddressing& at, int batch, int seq, int head) {
  return batch * at.out_batch + seq * at.out_seq + head * at.out_head;
}
__device__ __forceinline__ std::int64_t lse_offset(const RowAddressing& at, int batch, int seq, int head) {
  return batch * at.lse_batch + head * at.lse_head + seq * at.lse_seq;
}

// One warp per (batch, seq, head) row; lanes stride over head_dim. Each
// element is read before it is written by the same thread, and the lse after
// the warp has read it, so out == out_a (in place) is safe.
template <typename Element, typename ElementB>
__global__ void merge_states_kernel(MergeParams params) {
  const std::int64_t row = static_cast<std::int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= params.rows) return;
  const int head = static_cast<int>(row % params.heads);
  const int seq = static_cast<int>((row / params.heads) % params.seq_len);
  const int batch = static_cast<int>(row / (static_cast<std::int64_t>(params.heads) * params.seq_len));

  const MergedLse merged = merge_lse(params.lse_a[lse_offset(params.a, batch, seq, head)],
                                     params.lse_b[lse_offset(params.b, batch, seq, head)]);
  const float scale_a = merged.weight_a, scale_b = merged.weight_b;

  const auto* out_a = static_cast<const Element*>(params.out_a) + out_offset(params.a, batch, seq, head);
  const auto* out_b = static_cast<const ElementB*>(params.out_b) + out_offset(params.b, batch, seq, head);
  auto* out = static_cast<Element*>(params.out) + out_offset(params.merged, batch, seq, head);
  for (int d = threadIdx.x; d < params.head_dim; d += warpSize)
    store_float(out + d, scale_a * load_float(out_a + d) + scale_b * load_float(out_b + d));
  __syncwarp();
  if (threadIdx.x == 0) params.lse[lse_offset(params.merged, batch, seq, head)] = merged.lse;
}

template <typename Element, typename ElementB = Element>
Status launch_typed(const MergeParams& params, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 4;
  const dim3 block(32, kRowsPerBlock);
  const auto blocks = static_cast<unsigned>((params.rows + kRowsPerBlock - 1) / kRowsPerBlock);
  merge_states_kernel<Element, ElementB><<<blocks, block, 0, stream>>>(params);
  return launch_status("merge_states_kernel");
}

}  // namespace

Status launch_merge_states(const MergeProblem& problem, cudaStream_t stream) {
  MergeParams params{};
  params.out_a = problem.out_a.data;
  params.lse_a = static_cast<const float*>(problem.lse_a.data);
  params.out_b = problem.out_b.data;
  params.lse_b = static_cast<const float*>(problem.lse_b.data);
  params.out = problem.out.data;
  params.lse = static_cast<float*>(problem.lse.data);
  params.a = addressing_of(problem.out_a, problem.lse_a);
  params.b = addressing_of(problem.out_b, problem.lse_b);
  params.merged = addressing_of(problem.out, problem.lse);
  params.seq_len = problem.seq_len;
  params.heads = problem.heads;
  params.head_dim = problem.head_dim;
  params.rows = static_cast<std::int64_t>(problem.batch) * problem.seq_len * problem.heads;
  if (params.rows == 0) return {};
  if (problem.dtype == DType::f32 && problem.dtype_b == DType::f16) return launch_typed<float, __half>(params, stream);
  if (problem.dtype == DType::f32 && problem.dtype_b == DType::bf16)
    return launch_typed<float, __nv_bfloat16>(params, stream);
  switch (problem.dtype) {
    case DType::f32: return launch_typed<float>(params, stream);
    case DType::f16: return launch_typed<__half>(params, stream);
    case DType::bf16: return launch_typed<__nv_bfloat16>(params, stream);
    case DType::i32: break;
  }
  return {StatusCode::internal, "merge_states: dtype passed validation but has no kernel"};
}

}  // namespace cuflash::detail
