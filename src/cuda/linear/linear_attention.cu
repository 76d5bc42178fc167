// Linear attention on backend cuda: the problem's views into LinearParams, the
// choice between the chunked tensor-core kernels and the SIMT recurrence, the
// workspace layout and the launches.
#include "linear/linear_attention.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "common/cuda_check.hpp"
#include "common/kernel_attributes.hpp"
#include "common/scratch.hpp"
#include "common/varlen_tail.hpp"
#include "linear/linear_chunk_launch.hpp"
#include "linear/linear_params.hpp"
#include "linear/linear_simt.cuh"

namespace cuflash::detail {

namespace {

using linear::LinearParams;
using linear::RowsView;
using linear::StateView;

RowsView rows_view(const TensorView& view, bool varlen) {
  if (view.empty()) return {};
  if (varlen) return {view.data, 0, view.strides[0], view.strides[1]};
  return {view.data, view.strides[0], view.strides[1], view.strides[2]};
}

StateView state_view(const TensorView& view) {
  if (view.empty()) return {};
  return {static_cast<float*>(view.data), view.strides[0], view.strides[1], view.rank == 4 ? view.strides[2] : 0};
}

LinearParams make_params(const LinearProblem& p) {
  LinearParams k;
  k.q = rows_view(p.q, p.varlen);
  k.k = rows_view(p.k, p.varlen);
  k.v = rows_view(p.v, p.varlen);
  k.out = rows_view(p.out, p.varlen);
  k.dout = rows_view(p.dout, p.varlen);
  k.dq = rows_view(p.dq, p.varlen);
  k.dk = rows_view(p.dk, p.varlen);
  k.dv = rows_view(p.dv, p.varlen);
  k.initial_state = state_view(p.initial_state);
  k.initial_key_sum = state_view(p.initial_key_sum);
  k.final_state = state_view(p.final_state);
  k.final_key_sum = state_view(p.final_key_sum);
  k.dfinal_state = state_view(p.dfinal_state);
  k.dfinal_key_sum = state_view(p.dfinal_key_sum);
  k.dinitial_state = state_view(p.dinitial_state);
  k.dinitial_key_sum = state_view(p.dinitial_key_sum);
  k.cu_seqlens = p.varlen ? static_cast<const std::int32_t*>(p.cu_seqlens.data) : nullptr;
  k.batch = p.batch;
  k.heads_q = p.heads_q;
  k.heads_kv = p.heads_kv;
  k.group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  k.key_dim = p.key_dim;
  k.value_dim = p.value_dim;
  k.seq_len = p.max_len;
  k.scale = p.scale;
  k.map = static_cast<linear::Map>(static_cast<int>(p.feature_map));
  k.causal = p.causal;
  k.normalize = p.normalize;
  return k;
}

// Grid dims y and z stop at 65535.
constexpr int kMaxGridYZ = 65535;

std::size_t simt_smem_bytes(const LinearProblem& p) {
  return static_cast<std::size_t>(linear::simt_smem_floats(p.key_dim, p.value_dim)) * sizeof(float);
}

int max_smem_optin() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 48 * 1024;
  if (cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 48 * 1024;
  return bytes;
}

bool empty_problem(const LinearProblem& p) { return p.batch == 0 || p.heads_kv == 0; }

template <typename T>
Status launch_simt_forward(const LinearParams& params, std::size_t smem, cudaStream_t stream) {
  auto* kernel = linear::linear_simt_forward_kernel<T>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, smem, "linear_simt_forward_kernel"));
  kernel<<<dim3(params.heads_kv, params.batch), linear::kSimtThreads, smem, stream>>>(params);
  return launch_status("linear_simt_forward_kernel");
}

template <typename T>
Status launch_simt_backward(const LinearParams& params, linear::SimtBackwardScratch scratch, std::size_t smem,
                            cudaStream_t stream) {
  auto* kernel = linear::linear_simt_backward_kernel<T>;
  CUFLASH_TRY(allow_dynamic_smem(kernel, smem, "linear_simt_backward_kernel"));
  kernel<<<dim3(params.heads_kv, params.batch), linear::kSimtThreads, smem, stream>>>(params, scratch);
  return launch_status("linear_simt_backward_kernel");
}

template <typename Launch>
Status by_dtype(DType dtype, Launch launch) {
  switch (dtype) {
    case DType::f16: return launch(__half{});
    case DType::bf16: return launch(__nv_bfloat16{});
    default: return launch(float{});
  }
}

}  // namespace

Status linear_cuda_supports(const LinearProblem& p) {
  if (p.varlen && !p.host_indices_valid)
    return Status::unsupported("cu_seqlens: backend cuda's linear attention sizes its grid from the sequence lengths "
                               "and needs cu_seqlens copied to the host (check_index_contents was off)");
  if (p.batch > kMaxGridYZ)
    return Status::unsupported("batch: backend cuda's linear attention runs at most " + std::to_string(kMaxGridYZ) +
                               " sequences per call, got " + std::to_string(p.batch));
  if (linear_chunk_supports(p)) return {};
  const std::size_t smem = simt_smem_bytes(p);
  if (smem > static_cast<std::size_t>(max_smem_optin()))
    return Status::unsupported("key_dim: backend cuda's linear attention holds the fp32 state (key_dim x value_dim = " +
                               std::to_string(p.key_dim) + " x " + std::to_string(p.value_dim) +
                               ") in shared memory on this path (f32, or head dims other than 64/128); it needs " +
                               std::to_string(smem) + " bytes, the device has " + std::to_string(max_smem_optin()) +
                               " (backend cpu takes any)");
  return {};
}

std::size_t linear_cuda_workspace_bytes(const LinearProblem& p) {
  if (empty_problem(p)) return 0;
  if (linear_chunk_supports(p)) return linear_chunk_workspace_bytes(p);
  if (p.pass != LinearPass::backward) return 0;
  const std::int64_t rows = p.packed_rows();
  return align256(rows * p.heads_q * p.value_dim * sizeof(float)) + align256(rows * p.heads_q * sizeof(float));
}

Status linear_cuda_forward(const LinearProblem& p, void* workspace, cudaStream_t stream) {
  if (empty_problem(p)) return {};
  const LinearParams params = make_params(p);
  if (linear_chunk_supports(p)) return linear_chunk_forward(p, params, workspace, stream);
  const std::size_t smem = simt_smem_bytes(p);
  return by_dtype(p.dtype, [&](auto tag) { return launch_simt_forward<decltype(tag)>(params, smem, stream); });
}

Status linear_cuda_backward(const LinearProblem& p, void* workspace, cudaStream_t stream) {
  if (!empty_problem(p)) {
    const LinearParams params = make_params(p);
    if (linear_chunk_supports(p)) {
      CUFLASH_TRY(linear_chunk_backward(p, params, workspace, stream));
    } else {
      const std::int64_t rows = p.packed_rows();
      linear::SimtBackwardScratch scratch;
      scratch.dnum = static_cast<float*>(workspace);
      scratch.dden = reinterpret_cast<float*>(static_cast<char*>(workspace) +
                                              align256(rows * p.heads_q * p.value_dim * sizeof(float)));
      const std::size_t smem = simt_smem_bytes(p);
      CUFLASH_TRY(by_dtype(p.dtype, [&](auto tag) {
        return launch_simt_backward<decltype(tag)>(params, scratch, smem, stream);
      }));
    }
  }
  // Packed rows after the last sequence belong to none: their gradients are 0.
  if (!p.varlen) return {};
  for (const TensorView* grad : {&p.dq, &p.dk, &p.dv})
    if (grad->numel() > 0) CUFLASH_TRY(zero_rows_after_sequences(*grad, p.cu_seqlens.data, p.batch, stream));
  return {};
}

}  // namespace cuflash::detail
