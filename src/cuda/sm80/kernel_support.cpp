#include "sm80/kernel_support.hpp"

#include <cstdint>
#include <string>

#include "common/device_info.hpp"

namespace cuflash::detail {

Status check_kernel_view(const TensorView& view, const char* name) {
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  if (address % 16 != 0)
    return Status::unsupported(std::string("backend cuda: ") + name +
                               " must start on a 16-byte boundary for the tensor-core kernels");
  for (int d = 0; d + 1 < view.rank; ++d) {
    if (view.strides[d] % 8 != 0)
      return Status::unsupported(std::string("backend cuda: ") + name + " stride " + std::to_string(d) + " is " +
                                 std::to_string(view.strides[d]) +
                                 " elements; the tensor-core kernels need multiples of 8 (16-byte rows)");
  }
  return {};
}

Status sm80_attention_supports(const Problem& problem, const char* pass) {
  const std::string prefix = std::string("backend cuda ") + pass + ": ";
  if (problem.dtype != DType::f16 && problem.dtype != DType::bf16)
    return Status::unsupported(prefix + "the tensor-core kernels take f16 and bf16");
  if (sm80::kernel_head_dim(problem.head_dim) == 0)
    return Status::unsupported(prefix + "head_dim " + std::to_string(problem.head_dim) +
                               " is not supported for f16/bf16 (supported: " + sm80::head_dim_rule() + ")");
  if (problem.layout == Layout::kv_cache)
    return Status::unsupported(prefix + "KV caches take the decode kernel (flash_decode_supports), not this one");
  const DeviceInfo& info = device_info(problem.device.index);
  if (!info.valid) return Status::unsupported(prefix + "cannot query the GPU's properties");
  if (info.major < 8)
    return Status::unsupported(prefix + "needs compute capability 8.0 or newer (this GPU has " +
                               std::to_string(info.major) + "." + std::to_string(info.minor) + ")");
  CUFLASH_TRY(check_kernel_view(problem.q, "q"));
  CUFLASH_TRY(check_kernel_view(problem.k, "k"));
  CUFLASH_TRY(check_kernel_view(problem.v, "v"));
  return {};
}

}  // namespace cuflash::detail
