// The chunked tensor-core path of linear attention: which problems it takes,
// its workspace, the states' launches (shared with the backward) and the
// forward: states, scan, output pass (linear_chunk_state.cuh, linear_chunk_pass.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "linear/linear_chunk_launch.cuh"
#include "linear/linear_chunk_launch.hpp"

namespace cuflash::detail::linear {

// One thread per record element (state, then key sum, which only normalize reads).
__global__ void __launch_bounds__(kScanThreads) linear_state_scan_kernel(LinearParams p, ChunkWorkspace w,
                                                                         ScanEnds ends) {
  const int hk = blockIdx.y, b = blockIdx.z;
  const std::int64_t e = static_cast<std::int64_t>(blockIdx.x) * kScanThreads + threadIdx.x;
  const int state_floats = p.key_dim * p.value_dim;
  const bool is_state = e < state_floats;
  if (!is_state && (!p.normalize || e >= record_floats(p))) return;
  const int i = is_state ? static_cast<int>(e / p.value_dim) : static_cast<int>(e - state_floats);
  const int j = is_state ? static_cast<int>(e % p.value_dim) : 0;
  // Element (i, j) of a state, element i of a key sum.
  auto element = [&](const StateView& view) { return is_state ? view.at(b, hk, i) + j : view.at(b, hk, 0) + i; };
  const StateView& start = is_state ? ends.start_state : ends.start_key_sum;
  float running = start.data ? *element(start) : 0.0f;
  const SequenceSpan span = sequence_span(p, b);
  const int blocks = (span.length + kBlockRows - 1) / kBlockRows;
  const std::int64_t stride = static_cast<std::int64_t>(p.heads_kv) * record_floats(p);
  float* at = w.records + (block_slot(p, b, span, 0) * p.heads_kv + hk) * record_floats(p) + e;
  // Eight loads in flight before the stores (which the compiler may not move
  // above loads of the same array): the scan is bound by memory latency.
  constexpr int kBatch = 8;
  for (int done = 0; done < blocks; done += kBatch) {
    float sums[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int block = ends.reverse ? blocks - 1 - (done + u) : done + u;
      sums[u] = done + u < blocks ? at[block * stride] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int block = ends.reverse ? blocks - 1 - (done + u) : done + u;
      if (p.causal && done + u < blocks) at[block * stride] = running;
      running += sums[u];
    }
  }
  const StateView& total = is_state ? ends.total_state : ends.total_key_sum;
  if (total.data) *element(total) = running;
  if (!p.causal) w.totals[(static_cast<std::int64_t>(b) * p.heads_kv + hk) * record_floats(p) + e] = running;
}

}  // namespace cuflash::detail::linear

namespace cuflash::detail {

namespace {

using linear::ChunkWorkspace;
using linear::LinearParams;
using linear::Pass;

bool aligned16(const TensorView& view) {
  if (reinterpret_cast<std::uintptr_t>(view.data) % 16 != 0) return false;
  for (int d = 0; d + 1 < view.rank; ++d)
    if (view.strides[d] % 8 != 0) return false;
  return true;
}

// CUFLASH_LINEAR_KERNEL=simt keeps every linear-attention call on the SIMT
// recurrence (linear_simt.cuh), so that tests and benchmarks can hold the
// tensor-core kernels against it; read on every call.
bool simt_forced() {
  const char* value = std::getenv("CUFLASH_LINEAR_KERNEL");
  return value != nullptr && std::strcmp(value, "simt") == 0;
}

}  // namespace

namespace linear {

Status launch_state_scan(const LinearProblem& problem, const LinearParams& p, const ChunkWorkspace& w,
                         const ScanEnds& ends, cudaStream_t stream) {
  const unsigned elements = static_cast<unsigned>(record_floats(problem));
  const dim3 grid((elements + kScanThreads - 1) / kScanThreads, p.heads_kv, p.batch);
  linear_state_scan_kernel<<<grid, kScanThreads, 0, stream>>>(p, w, ends);
  return launch_status("linear_state_scan_kernel");
}

template <typename T>
Status launch_states(const LinearProblem& problem, const LinearParams& p, const ChunkWorkspace& w,
                     cudaStream_t stream) {
  CUFLASH_TRY((launch_block_sum<T, Pass::output>(p, w, stream)));
  ScanEnds ends;
  ends.start_state = p.initial_state;
  ends.start_key_sum = p.initial_key_sum;
  ends.total_state = p.final_state;
  ends.total_key_sum = p.final_key_sum;
  return launch_state_scan(problem, p, w, ends, stream);
}

template Status launch_states<__half>(const LinearProblem&, const LinearParams&, const ChunkWorkspace&, cudaStream_t);
template Status launch_states<__nv_bfloat16>(const LinearProblem&, const LinearParams&, const ChunkWorkspace&,
                                             cudaStream_t);

}  // namespace linear

bool linear_chunk_supports(const LinearProblem& p) {
  if (p.pass == LinearPass::step || simt_forced()) return false;
  if (p.dtype != DType::f16 && p.dtype != DType::bf16) return false;
  if ((p.key_dim != 64 && p.key_dim != 128) || (p.value_dim != 64 && p.value_dim != 128)) return false;
  if (p.heads_kv > 65535) return false;
  const bool backward = p.pass == LinearPass::backward;
  for (const TensorView* view : {&p.q, &p.k, &p.v, backward ? &p.dout : &p.out})
    if (!aligned16(*view)) return false;
  if (backward)
    for (const TensorView* view : {&p.dq, &p.dk, &p.dv})
      if (!aligned16(*view)) return false;
  return true;
}

std::size_t linear_chunk_workspace_bytes(const LinearProblem& p) {
  return linear::records_bytes(p) + linear::totals_bytes(p) + linear::row_stats_bytes(p);
}

Status linear_chunk_forward(const LinearProblem& problem, const LinearParams& params, void* workspace,
                            cudaStream_t stream) {
  const ChunkWorkspace w = linear::chunk_workspace(problem, workspace);
  return linear::for_half_dtype(problem.dtype, [&](auto tag) {
    using T = decltype(tag);
    CUFLASH_TRY(linear::launch_states<T>(problem, params, w, stream));
    return linear::launch_pass<T, Pass::output>(params, w, stream);
  });
}

}  // namespace cuflash::detail
