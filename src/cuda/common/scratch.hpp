// Scratch memory of a GPU call: the caller's workspace, else a block from the
// caller's allocator, else stream-ordered memory from the CUDA pool; the last
// two go back on the same stream after the call's kernels are enqueued.
// Shared by the cuda and cudnn backends.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "common/cuda_check.hpp"
#include "cuflash/options.hpp"
#include "cuflash/status.hpp"

namespace cuflash::detail {

// Workspace regions start at 256-byte boundaries (cudaMalloc's alignment), so
// that every region is aligned for vector accesses whatever precedes it.
constexpr std::size_t align256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (from_allocator_.given())
      from_allocator_.release(pointer_, stream_, from_allocator_.state);
    else if (owned_)
      (void)cudaFreeAsync(pointer_, stream_);
  }

  // A workspace smaller than `bytes` is the caller's mistake: invalid_argument, nothing written.
  Status acquire(const RunContext& context, std::size_t bytes, cudaStream_t stream) {
    stream_ = stream;
    if (bytes == 0) return {};
    if (context.workspace != nullptr) {
      if (context.workspace_bytes < bytes)
        return Status::invalid("workspace: this call needs " + std::to_string(bytes) + " bytes, RunContext gives " +
                               std::to_string(context.workspace_bytes) +
                               " (ask forward_workspace_size/backward_workspace_size, or pass none)");
      pointer_ = context.workspace;
      return {};
    }
    if (context.allocator.given()) {
      pointer_ = context.allocator.allocate(bytes, stream, context.allocator.state);
      if (pointer_ == nullptr)
        return Status(StatusCode::cuda_error,
                      "workspace: out of memory: the caller's allocator could not give " + std::to_string(bytes) +
                          " bytes");
      if (context.allocator.release != nullptr) from_allocator_ = context.allocator;
      return {};
    }
    CUFLASH_TRY(cuda_status(cudaMallocAsync(&pointer_, bytes, stream), "cudaMallocAsync(workspace)"));
    owned_ = true;
    return {};
  }
  void* get() const { return pointer_; }

 private:
  void* pointer_ = nullptr;
  bool owned_ = false;
  WorkspaceAllocator from_allocator_;  // given: pointer_ goes back to it
  cudaStream_t stream_ = nullptr;
};

}  // namespace cuflash::detail
