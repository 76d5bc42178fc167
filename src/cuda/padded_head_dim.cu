#include "common/padded_head_dim.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/scratch.hpp"
#include "sm80/head_dims.hpp"

namespace cuflash::detail {

namespace {

using sm80::kHeadDimAlign;  // elements of a 16-byte chunk of f16/bf16: what a row is padded to

// Up to four axes: the view's outer axes (right-aligned) and its columns.
struct Axes {
  std::int64_t shape[4] = {1, 1, 1, 1};
  std::int64_t src_strides[4] = {0, 0, 0, 0};
  std::int64_t dst_strides[4] = {0, 0, 0, 0};
};

Axes axes_of(const TensorView& from, const TensorView& to) {
  Axes a;
  const int offset = 4 - from.rank;
  for (int d = 0; d < from.rank; ++d) {
    a.shape[offset + d] = to.shape[d];  // the destination's extent: the padded one on padding
    a.src_strides[offset + d] = from.strides[d];
    a.dst_strides[offset + d] = to.strides[d];
  }
  return a;
}

// to[..., c] = c < cols ? from[..., c] : 0, over `to`'s extents (2-byte
// elements): a warp per row, its lanes along the columns (coalesced), the
// row's offsets formed once.
__global__ void copy_columns_kernel(const std::uint16_t* from, std::uint16_t* to, Axes a, std::int64_t cols) {
  const std::int64_t rows = a.shape[0] * a.shape[1] * a.shape[2];
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / 32);
  for (std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x / 32) + threadIdx.x / 32; row < rows;
       row += warps) {
    std::int64_t rest = row, src = 0, dst = 0;
    for (int d = 2; d >= 0; --d) {
      const std::int64_t i = rest % a.shape[d];
      rest /= a.shape[d];
      src += i * a.src_strides[d];
      dst += i * a.dst_strides[d];
    }
    for (std::int64_t c = lane; c < a.shape[3]; c += 32) to[dst + c] = c < cols ? from[src + c] : std::uint16_t(0);
  }
}

// `to` (every element) from `from`'s first `cols` columns, zeros past them.
Status copy_columns(const TensorView& from, const TensorView& to, std::int64_t cols, cudaStream_t stream) {
  if (from.empty() || to.numel() == 0) return {};
  constexpr int kThreads = 256;
  const std::int64_t rows = to.numel() / to.shape[to.rank - 1];
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((rows + kThreads / 32 - 1) / (kThreads / 32), 8192));
  copy_columns_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const std::uint16_t*>(from.data),
                                                       static_cast<std::uint16_t*>(to.data), axes_of(from, to), cols);
  return launch_status("copy_columns_kernel");
}

int padded_dim(int head_dim) { return (head_dim + kHeadDimAlign - 1) / kHeadDimAlign * kHeadDimAlign; }

// `view` with its last axis `dim` wide, contiguous, at `*next` (advanced).
TensorView padded_view(const TensorView& view, int dim, char*& next, std::size_t& bytes) {
  if (view.empty()) return view;
  TensorView padded = view;
  padded.shape[view.rank - 1] = dim;
  std::int64_t stride = 1;
  for (int d = view.rank - 1; d >= 0; --d) {
    padded.strides[d] = stride;
    stride *= padded.shape[d];
  }
  const std::size_t size = align256(static_cast<std::size_t>(padded.numel()) * dtype_size(view.dtype));
  padded.data = next;
  next = next == nullptr ? nullptr : next + size;
  bytes += size;
  return padded;
}

}  // namespace

bool needs_padded_head_dim(const Problem& problem) {
  // Above the kernels' largest head dim there is nothing to pad for: the
  // kernels refuse the caller's own head dim.
  return (problem.dtype == DType::f16 || problem.dtype == DType::bf16) && problem.head_dim % kHeadDimAlign != 0 &&
         problem.head_dim < sm80::kMaxHeadDim;
}

PaddedHeadDim padded_head_dim(const Problem& problem, void* scratch) {
  PaddedHeadDim result;
  result.problem = problem;
  Problem& p = result.problem;
  const int dim = padded_dim(problem.head_dim);
  p.head_dim = dim;
  char* next = static_cast<char*>(scratch);
  for (TensorView* view : {&p.q, &p.k, &p.v, &p.out, &p.k_new, &p.v_new, &p.dout, &p.dq, &p.dk, &p.dv})
    *view = padded_view(*view, dim, next, result.bytes);
  return result;
}

Status pad_head_dim_inputs(const Problem& problem, const Problem& padded, cudaStream_t stream) {
  const std::int64_t cols = problem.head_dim;
  CUFLASH_TRY(copy_columns(problem.q, padded.q, cols, stream));
  CUFLASH_TRY(copy_columns(problem.k, padded.k, cols, stream));
  CUFLASH_TRY(copy_columns(problem.v, padded.v, cols, stream));
  CUFLASH_TRY(copy_columns(problem.k_new, padded.k_new, cols, stream));
  CUFLASH_TRY(copy_columns(problem.v_new, padded.v_new, cols, stream));
  if (problem.pass == Pass::forward) return {};
  CUFLASH_TRY(copy_columns(problem.out, padded.out, cols, stream));
  return copy_columns(problem.dout, padded.dout, cols, stream);
}

Status unpad_head_dim_outputs(const Problem& problem, const Problem& padded, cudaStream_t stream) {
  const std::int64_t cols = problem.head_dim;
  if (problem.pass == Pass::backward) {
    CUFLASH_TRY(copy_columns(padded.dq, problem.dq, cols, stream));
    CUFLASH_TRY(copy_columns(padded.dk, problem.dk, cols, stream));
    return copy_columns(padded.dv, problem.dv, cols, stream);
  }
  CUFLASH_TRY(copy_columns(padded.out, problem.out, cols, stream));
  if (problem.new_len == 0) return {};
  // The append wrote the new rows into the padded cache: the whole cache goes back.
  CUFLASH_TRY(copy_columns(padded.k, problem.k, cols, stream));
  return copy_columns(padded.v, problem.v, cols, stream);
}

}  // namespace cuflash::detail
