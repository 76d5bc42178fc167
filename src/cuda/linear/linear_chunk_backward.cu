// The chunked tensor-core backward of linear attention (docs/linear.md,
// "GPU kernels"), per (sequence, kv head) in blocks of 256 rows:
//  1-2. the states S at the blocks' starts (non-causal: the totals), the
//       forward's own launches. Recomputed rather than kept by the forward:
//       the backward's arguments are q, k, v and dout (the API has no saved
//       tensors), and a block's record costs Dk·Dv·4 bytes (64 KiB at
//       128 x 128) for 256 rows, which the two block launches recompute from
//       one read of k and v.
//  3.   normalize: the row_stats pass (den_t and dout_t · num_t per row and
//       query head: the output pass with another epilogue).
//  4.   dq pass: dq = dO Sᵀ + (tril(dO Vᵀ) - δ) φK (÷ den, - δ z), per Dk slice.
//  5-6. the gradient states G (= dS after each block) into the same records:
//       block sums of (φQ/den)ᵀ dO over the group, then a reverse scan from
//       dfinal_state whose total is dinitial_state.
//  7.   dv pass: dv = φK G + triu(φK (φQ/den)ᵀ) dO, per Dv slice.
//  8.   dk pass: dk = φ'(k) ⊙ (V Gᵀ + (triu(V dOᵀ) - δ) φQ/den + g), per Dk slice.
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
Status backward_for_dtype(const LinearProblem& problem, const LinearParams& p, const ChunkWorkspace& w,
                          cudaStream_t stream) {
  CUFLASH_TRY(linear::launch_states<T>(problem, p, w, stream));
  if (p.normalize) CUFLASH_TRY((linear::launch_pass<T, Pass::row_stats>(p, w, stream)));
  CUFLASH_TRY((linear::launch_pass<T, Pass::dq>(p, w, stream)));
  CUFLASH_TRY((linear::launch_block_sum<T, Pass::dv>(p, w, stream)));
  linear::ScanEnds ends;
  ends.start_state = p.dfinal_state;
  ends.start_key_sum = p.dfinal_key_sum;
  ends.total_state = p.dinitial_state;
  ends.total_key_sum = p.dinitial_key_sum;
  ends.reverse = true;
  CUFLASH_TRY(linear::launch_state_scan(problem, p, w, ends, stream));
  CUFLASH_TRY((linear::launch_pass<T, Pass::dv>(p, w, stream)));
  return linear::launch_pass<T, Pass::dk>(p, w, stream);
}

}  // namespace

Status linear_chunk_backward(const LinearProblem& problem, const LinearParams& params, void* workspace,
                             cudaStream_t stream) {
  const ChunkWorkspace w = linear::chunk_workspace(problem, workspace);
  return linear::for_half_dtype(problem.dtype,
                                [&](auto tag) { return backward_for_dtype<decltype(tag)>(problem, params, w, stream); });
}

}  // namespace cuflash::detail
