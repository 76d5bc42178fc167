#include "cudnn_support.hpp"

#include <cstdint>
#include <string>

#include "backend.hpp"
#include "common/device_info.hpp"

namespace cuflash::detail::cudnn {

namespace {

// cuDNN's kernels move Q/K/V/O (and the gradients) in 16-byte vectors and do
// not check addresses: a row off 16 bytes is refused here, not computed wrong.
Status check_view(const TensorView& view, const char* name, const std::string& prefix) {
  if (view.empty()) return {};
  if (reinterpret_cast<std::uintptr_t>(view.data) % 16 != 0)
    return Status::unsupported(prefix + name + " must start on a 16-byte boundary (cuDNN reads 16-byte vectors)");
  for (int d = 0; d + 1 < view.rank; ++d)
    if (view.shape[d] > 1 && view.strides[d] % 8 != 0)
      return Status::unsupported(prefix + name + " stride " + std::to_string(d) + " is " +
                                 std::to_string(view.strides[d]) +
                                 " elements; cuDNN needs multiples of 8 (16-byte rows)");
  return {};
}

}  // namespace

Status check_problem(const Problem& p) {
  // (cuDNN's SDPA does have dropout, but not with cuflash's Philox mask.)
  CUFLASH_TRY(refuse_cpu_only_features(p, "cudnn"));
  const std::string prefix = std::string("backend cudnn ") + (p.pass == Pass::forward ? "forward" : "backward") + ": ";
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return Status::unsupported(prefix + "dtype " + dtype_name(p.dtype) +
                               " is not supported (cuDNN's fused attention takes f16 and bf16)");
  if (p.head_dim % 8 != 0 || p.head_dim > kMaxHeadDim)
    return Status::unsupported(prefix + "head_dim " + std::to_string(p.head_dim) +
                               " is not supported (cuDNN's fused attention takes multiples of 8 up to " +
                               std::to_string(kMaxHeadDim) + ")");
  if (p.softcap > 0.0f)
    return Status::unsupported(prefix + "softcap is not supported (cuDNN's fused attention has no tanh soft-capping "
                                        "that combines with its masks)");
  // A softmax_scale <= 0 (validate() takes any finite one): PyTorch 2.11's
  // cuDNN SDPA returned NaN outputs and gradients for scales 0, -0.125 and
  // -1 in 12 of 12 cases (H200, D = 64 and 128, causal and not; the positive
  // scale beside them was right), as a kernel does that takes a row's max
  // before scaling (attention_params.hpp, transformed_scores). This backend
  // builds the same cuDNN SDPA graphs; the cuda backend runs these scales.
  if (!(p.softmax_scale > 0.0f))
    return Status::unsupported(prefix + "softmax_scale " + std::to_string(p.softmax_scale) +
                               " is not supported (cuDNN's fused attention returned NaN for scales <= 0); "
                               "backend cuda runs it");
  if (p.has_diagonal_offset)
    return Status::unsupported(prefix + "diagonal_offset is not supported (cuDNN aligns its masks top-left or "
                                        "bottom-right only)");
  if (p.has_alibi)
    return Status::unsupported(prefix + "ALiBi (alibi_slopes) is not supported (cuDNN's alibi_mask takes no "
                                        "caller-given slopes and no bottom-right alignment)");
  if (p.layout == Layout::kv_cache && p.pass == Pass::backward)
    return Status::unsupported(prefix + "KV-cache (paged or contiguous) backward is not supported "
                                        "(cuDNN's paged attention is forward-only)");
  if (p.paged_varlen())
    return Status::unsupported(prefix + "varlen with kv_cache.block_table (keys in pages) is not supported: the "
                                        "cuDNN plans here read packed varlen keys or a KV cache with seqlens_k; "
                                        "backend cuda runs it");
  if (p.layout == Layout::kv_cache && p.new_len > 0)
    return Status::unsupported(prefix + "KV-cache append (kv_cache.k_new/v_new) is not supported: write the new "
                                        "keys into the cache first, or use backend cpu");
  // cuDNN 9.19's kernels for more than one query per sequence read the cache
  // slots past seqlens_k and multiply their V rows by zero probabilities:
  // stale NaN/Inf there (the slots are not the caller's input) turns the
  // output NaN. Seen on the H100: 22 of 22 such cases wrong with NaN in the
  // unused slots, 22 of 22 right with finite values there. Decode (one query)
  // does not read them.
  if (p.layout == Layout::kv_cache && p.max_q_len > 1)
    return Status::unsupported(prefix + "KV-cache calls with more than one query per sequence (q_len " +
                               std::to_string(p.max_q_len) +
                               ") are not supported: cuDNN reads the cache slots past seqlens_k, whose stale "
                               "contents could reach the output; decode (q_len 1) is supported");
  const DeviceInfo& info = device_info(p.device.index);
  if (!info.valid) return Status::unsupported(prefix + "cannot query the GPU's properties");
  if (info.major < 8)
    return Status::unsupported(prefix + "cuDNN's fused attention needs compute capability 8.0 or newer (this GPU has " +
                               std::to_string(info.major) + "." + std::to_string(info.minor) + ")");
  for (const auto& [name, view] : {std::pair{"q", p.q}, std::pair{"k", p.k}, std::pair{"v", p.v},
                                   std::pair{"out", p.out}, std::pair{"dout", p.dout}, std::pair{"dq", p.dq},
                                   std::pair{"dk", p.dk}, std::pair{"dv", p.dv}})
    CUFLASH_TRY(check_view(view, name, prefix));
  return {};
}

}  // namespace cuflash::detail::cudnn
