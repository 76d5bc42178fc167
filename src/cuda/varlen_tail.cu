#include "common/varlen_tail.hpp"

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"

namespace cuflash::detail {

namespace {

// Grid-stride over the elements of rows [cu[batch], total); Word is the
// element's size (zero bits are 0 in f32, f16 and bf16).
template <typename Word>
__global__ void zero_tail_kernel(Word* data, const std::int32_t* cu_seqlens, int batch, std::int64_t total,
                                 std::int64_t heads, std::int64_t dim, std::int64_t row_stride,
                                 std::int64_t head_stride) {
  const std::int64_t first = cu_seqlens[batch];
  const std::int64_t count = (total - first) * heads * dim;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < count;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = first + idx / (heads * dim);
    const std::int64_t h = (idx / dim) % heads, d = idx % dim;
    data[row * row_stride + h * head_stride + d] = Word(0);
  }
}

}  // namespace

Status zero_rows_after_sequences(const TensorView& view, const void* cu_seqlens, int batch, cudaStream_t stream) {
  const std::int64_t total = view.shape[0], heads = view.shape[1], dim = view.shape[2];
  if (total == 0) return {};
  constexpr int kThreads = 256;
  const std::int64_t elements = total * heads * dim;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((elements + kThreads - 1) / kThreads, 1024));
  const auto* cu = static_cast<const std::int32_t*>(cu_seqlens);
  if (dtype_size(view.dtype) == 4) {
    zero_tail_kernel<std::uint32_t><<<blocks, kThreads, 0, stream>>>(static_cast<std::uint32_t*>(view.data), cu, batch,
                                                                      total, heads, dim, view.strides[0], view.strides[1]);
  } else {
    zero_tail_kernel<std::uint16_t><<<blocks, kThreads, 0, stream>>>(static_cast<std::uint16_t*>(view.data), cu, batch,
                                                                      total, heads, dim, view.strides[0], view.strides[1]);
  }
  return launch_status("zero_tail_kernel");
}

}  // namespace cuflash::detail
