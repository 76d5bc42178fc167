#include "index_copy.hpp"
#include "cuflash/cuflash.hpp"

#include <cstring>
#include <string>

#if defined(CUFLASH_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace cuflash::detail {

bool built_with_cuda() {
#if defined(CUFLASH_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

Status copy_index_tensor(const TensorView& view, const char* name, void* stream, std::vector<std::int32_t>* values) {
  const std::int64_t rows = view.rank == 2 ? view.shape[0] : 1;
  const std::int64_t cols = view.shape[view.rank - 1];
  const std::int64_t row_stride = view.rank == 2 ? view.strides[0] : cols;
  values->assign(static_cast<std::size_t>(rows * cols), 0);
  if (rows * cols == 0) return {};
  const auto* source = static_cast<const std::int32_t*>(view.data);

  if (view.device.kind == DeviceKind::host) {
    for (std::int64_t r = 0; r < rows; ++r)
      std::memcpy(values->data() + r * cols, source + r * row_stride, static_cast<std::size_t>(cols) * sizeof(std::int32_t));
    return {};
  }
#if defined(CUFLASH_WITH_CUDA)
  auto cuda_stream = static_cast<cudaStream_t>(stream);
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * sizeof(std::int32_t);
  cudaError_t error = cudaMemcpy2DAsync(values->data(), row_bytes, source, static_cast<std::size_t>(row_stride) * sizeof(std::int32_t),
                                        row_bytes, static_cast<std::size_t>(rows), cudaMemcpyDeviceToHost, cuda_stream);
  if (error == cudaSuccess) error = cudaStreamSynchronize(cuda_stream);
  if (error != cudaSuccess)
    return {StatusCode::cuda_error, std::string(name) + ": copying to the host to check its contents failed: " +
                                        cudaGetErrorString(error)};
  return {};
#else
  (void)stream;
  return Status::unsupported(std::string(name) + ": is in CUDA memory, but this build of cuflash has no CUDA support");
#endif
}

}  // namespace cuflash::detail

namespace cuflash {

bool stream_capturing(void* stream) {
#if defined(CUFLASH_WITH_CUDA)
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; leave no error behind for the next call
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
#else
  (void)stream;
  return false;
#endif
}

}  // namespace cuflash
