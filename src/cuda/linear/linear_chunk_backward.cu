// The chunked tensor-core backward of linear attention (docs/linear.md,
// "GPU kernels"), per (sequence, kv head) in chunks of 64 rows:
//  1. the walk of the states S at the chunks' starts (non-causal: the
//     totals), the forward's own launch. Recomputed rather than kept by the
//     forward: the backward's arguments are q, k, v and dout (the API has no
//     saved tensors), and the walk rebuilds them from one read of k and v.
//  2. normalize: the row_stats pass (den_t and dout_t · num_t per row and
//     query head: the output pass with another epilogue).
//  3. dq pass: dq = dO Sᵀ + (tril(dO Vᵀ) - δ) φK (÷ den, - δ z), per Dk slice.
//  4. the reverse walk of the gradient states G (= dS after each chunk) into
//     the same records, from dfinal_state; its total is dinitial_state.
//  5. dv pass: dv = φK G + triu(φK (φQ/den)ᵀ) dO, per Dv slice.
//  6. dk pass: dk = φ'(k) ⊙ (V Gᵀ + (triu(V dOᵀ) - δ) φQ/den + g), per Dk slice.
// Packed varlen rows after the last sequence are zeroed by the caller.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "linear/linear_chunk_launch.cuh"
#include "linear/linear_chunk_launch.hpp"

namespace cuflash::detail {

namespace {

using linear::ChunkWorkspace;
using linear::LinearParams;
using linear::Pass;

template <typename T>
Status backward_for_dtype(const LinearParams& p, const ChunkWorkspace& w, cudaStream_t stream) {
  CUFLASH_TRY(linear::launch_states<T>(p, w, stream));
  if (p.normalize) CUFLASH_TRY((linear::launch_pass<T, Pass::row_stats>(p, w, stream)));
  CUFLASH_TRY((linear::launch_pass<T, Pass::dq>(p, w, stream)));
  linear::WalkEnds ends;
  ends.start_state = p.dfinal_state;
  ends.start_key_sum = p.dfinal_key_sum;
  ends.total_state = p.dinitial_state;
  ends.total_key_sum = p.dinitial_key_sum;
  ends.reverse = true;
  CUFLASH_TRY((linear::launch_walk<T, Pass::dv>(p, w, ends, stream)));
  CUFLASH_TRY((linear::launch_pass<T, Pass::dv>(p, w, stream)));
  return linear::launch_pass<T, Pass::dk>(p, w, stream);
}

}  // namespace

Status linear_chunk_backward(const LinearProblem& problem, const LinearParams& params, void* workspace,
                             cudaStream_t stream) {
  const ChunkWorkspace w = linear::chunk_workspace(linear::chunk_plan(problem), problem, workspace);
  return linear::for_half_dtype(problem.dtype,
                                [&](auto tag) { return backward_for_dtype<decltype(tag)>(params, w, stream); });
}

}  // namespace cuflash::detail
