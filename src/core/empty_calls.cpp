#include "empty_calls.hpp"

#include "byte_dims.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(CUFLASH_WITH_CUDA)
#include <cuda_runtime_api.h>

#include "common/cuda_check.hpp"
#endif

namespace cuflash::detail {

bool has_query_rows(const Problem& p) {
  if (p.batch == 0 || p.heads_q == 0 || p.max_q_len == 0) return false;
  return p.layout != Layout::varlen || p.q.shape[0] > 0;
}

bool has_keys(const Problem& p) {
  if (p.batch == 0 || p.heads_kv == 0) return false;
  switch (p.layout) {
    case Layout::dense: return p.max_kv_len > 0;
    case Layout::varlen: return p.max_kv_len > 0 && p.k.shape[0] > 0;
    case Layout::kv_cache: return p.cache_capacity > 0 && p.num_pages > 0;
  }
  return true;
}

bool has_append(const Problem& p) {
  return p.layout == Layout::kv_cache && p.new_len > 0 && p.batch > 0 && p.heads_kv > 0;
}

Work work_of(const Problem& p) {
  if (p.pass == Pass::forward) return has_query_rows(p) || has_append(p) ? Work::backend : Work::nothing;
  return has_query_rows(p) && has_keys(p) ? Work::backend : Work::zero_gradients;
}

bool merge_has_rows(const MergeProblem& p) { return p.batch > 0 && p.seq_len > 0 && p.heads > 0; }

namespace {

// A view as rows of `row_bytes` contiguous bytes, placed by the remaining
// dimensions (`outer`, smallest stride first).
struct ByteRows {
  std::int64_t row_bytes = 1;
  std::vector<ByteDim> outer;
};

ByteRows byte_rows(const TensorView& view) {
  std::vector<ByteDim> dims = byte_dims(view);  // largest stride first
  ByteRows rows;
  while (!dims.empty() && dims.back().stride == rows.row_bytes) {
    rows.row_bytes *= dims.back().extent;
    dims.pop_back();
  }
  rows.outer.assign(dims.rbegin(), dims.rend());
  return rows;
}

// Calls visit(byte offset) for every index of dims[first..], in any order.
template <typename Visit>
void for_each_offset(const std::vector<ByteDim>& dims, std::size_t first, Visit visit) {
  std::vector<std::int64_t> index(dims.size(), 0);
  while (true) {
    std::int64_t offset = 0;
    for (std::size_t d = first; d < dims.size(); ++d) offset += index[d] * dims[d].stride;
    visit(offset);
    std::size_t d = first;
    while (d < dims.size() && ++index[d] == dims[d].extent) index[d++] = 0;
    if (d == dims.size()) return;
  }
}

#if defined(CUFLASH_WITH_CUDA)
Status fill_zeros_on_gpu(const TensorView& view, const ByteRows& rows, void* stream) {
  DeviceGuard guard(view.device.index);
  CUFLASH_TRY(guard.status());
  auto* base = static_cast<unsigned char*>(view.data);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (rows.outer.empty())
    return cuda_status(cudaMemsetAsync(base, 0, static_cast<std::size_t>(rows.row_bytes), cuda_stream), "cudaMemsetAsync");
  // The innermost outer dimension is the height of one 2-D memset; its
  // stride, the pitch, spans a row at least, as the view's elements do not
  // overlap (validation checked the outputs this fills).
  const ByteDim& height = rows.outer.front();
  cudaError_t error = cudaSuccess;
  for_each_offset(rows.outer, 1, [&](std::int64_t offset) {
    if (error == cudaSuccess)
      error = cudaMemset2DAsync(base + offset, static_cast<std::size_t>(height.stride), 0,
                                static_cast<std::size_t>(rows.row_bytes), static_cast<std::size_t>(height.extent),
                                cuda_stream);
  });
  return cuda_status(error, "cudaMemset2DAsync");
}
#endif

}  // namespace

Status fill_zeros(const TensorView& view, void* stream) {
  if (view.empty() || view.numel() == 0) return {};
  const ByteRows rows = byte_rows(view);
  if (view.device.kind == DeviceKind::host) {
    auto* base = static_cast<unsigned char*>(view.data);
    for_each_offset(rows.outer, 0, [&](std::int64_t offset) {
      std::memset(base + offset, 0, static_cast<std::size_t>(rows.row_bytes));
    });
    return {};
  }
#if defined(CUFLASH_WITH_CUDA)
  return fill_zeros_on_gpu(view, rows, stream);
#else
  (void)stream;
  return Status::unsupported("a tensor is in CUDA memory, but this build of cuflash has no CUDA support");
#endif
}

}  // namespace cuflash::detail
