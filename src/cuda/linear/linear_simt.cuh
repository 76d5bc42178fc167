// Linear attention as the token-by-token recurrence on CUDA cores, fp32
// throughout: the path of f32 inputs, of head dims the tensor-core kernels do
// not take, of the backward where those are not built, and of the decode step
// (one token: a GEMV on the state). One CTA per (sequence, kv head) holds the
// whole fp32 state S (Dk x Dv) and key sum z in shared memory, so any Dk, Dv
// with Dk * Dv * 4 bytes in shared memory run; the group's query heads share it.
//
// Forward, causal, token t: S += φk_t v_tᵀ, z += φk_t, then each query head's
//   o_t = φq_tᵀ S (÷ (φq_t·z + eps)); non-causal: a first sweep builds the totals.
// Backward: a forward sweep gives dnum_t, dden_t (kept in the workspace) and
// dq_t = scale φ'(q_t) ⊙ (S_t dnum_t + dden_t z_t); a reverse sweep carries
// G = dS, g = dz (G += φq_t dnum_tᵀ, g += dden_t φq_t over the group) and gives
// dk_t = φ'(k_t) ⊙ (G v_t + g), dv_t = Gᵀ φk_t. Non-causal: G sums all rows first.
#pragma once

#include <cuda_runtime.h>

#include "common/element_io.cuh"
#include "linear/linear_params.hpp"

namespace cuflash::detail::linear {

constexpr int kSimtThreads = 256;

// Shared memory of the SIMT kernels, in floats.
__host__ __device__ constexpr int simt_smem_floats(int dk, int dv) { return dk * dv + 3 * dk + 3 * dv + 8; }

__device__ __forceinline__ float block_sum(float value, float* scratch) {
  // Every thread gets the CTA-wide sum; `scratch` holds 8 floats (kSimtThreads / 32).
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kSimtThreads / 32; ++w) total += scratch[w];
  return total;
}

// S (or G) and z (or g) from a state-shaped view, or 0.
__device__ __forceinline__ void simt_load_state(const StateView& state, const StateView& key_sum, int b, int hk,
                                                int dk, int dv, float* s, float* z) {
  for (int e = threadIdx.x; e < dk * dv; e += kSimtThreads)
    s[e] = state.data ? state.at(b, hk, e / dv)[e % dv] : 0.0f;
  for (int i = threadIdx.x; i < dk; i += kSimtThreads) z[i] = key_sum.data ? key_sum.at(b, hk, 0)[i] : 0.0f;
}

__device__ __forceinline__ void simt_store_state(const StateView& state, const StateView& key_sum, int b, int hk,
                                                 int dk, int dv, const float* s, const float* z) {
  if (state.data)
    for (int e = threadIdx.x; e < dk * dv; e += kSimtThreads) state.at(b, hk, e / dv)[e % dv] = s[e];
  if (key_sum.data)
    for (int i = threadIdx.x; i < dk; i += kSimtThreads) key_sum.at(b, hk, 0)[i] = z[i];
}

// φ(k_t) into phi_k (raw k into raw_k when given) and v_t into v; no barrier.
template <typename T>
__device__ __forceinline__ void simt_load_key(const LinearParams& p, int b, const SequenceSpan& span, int t, int hk,
                                              float* phi_k, float* raw_k, float* v) {
  const T* k_row = row_pointer<const T>(p.k, b, span, t, hk);
  const T* v_row = row_pointer<const T>(p.v, b, span, t, hk);
  for (int i = threadIdx.x; i < p.key_dim; i += kSimtThreads) {
    const float x = load_float(k_row + i);
    phi_k[i] = feature(p.map, x);
    if (raw_k) raw_k[i] = x;
  }
  for (int j = threadIdx.x; j < p.value_dim; j += kSimtThreads) v[j] = load_float(v_row + j);
}

// S += φk vᵀ, z += φk; no barrier.
__device__ __forceinline__ void simt_add_outer(int dk, int dv, const float* phi_k, const float* v, float* s, float* z) {
  for (int e = threadIdx.x; e < dk * dv; e += kSimtThreads) s[e] += phi_k[e / dv] * v[e % dv];
  for (int i = threadIdx.x; i < dk; i += kSimtThreads) z[i] += phi_k[i];
}

// scale·φ(q_t) into phi_q (raw into raw_q when given); no barrier.
template <typename T>
__device__ __forceinline__ void simt_load_query(const LinearParams& p, int b, const SequenceSpan& span, int t, int h,
                                                float* phi_q, float* raw_q) {
  const T* q_row = row_pointer<const T>(p.q, b, span, t, h);
  for (int i = threadIdx.x; i < p.key_dim; i += kSimtThreads) {
    const float x = load_float(q_row + i);
    phi_q[i] = p.scale * feature(p.map, x);
    if (raw_q) raw_q[i] = x;
  }
}

// grid (Hk, B): the forward, and the decode step (a causal forward of one token
// whose initial/final state may be the same memory: S is read whole first).
template <typename T>
__global__ void __launch_bounds__(kSimtThreads) linear_simt_forward_kernel(LinearParams p) {
  extern __shared__ float smem[];
  const int hk = blockIdx.x, b = blockIdx.y;
  const int dk = p.key_dim, dv = p.value_dim;
  float* s = smem;
  float* z = s + dk * dv;
  float* phi_k = z + dk;
  float* phi_q = phi_k + dk;
  float* v = phi_q + dk;
  float* reduce = v + 3 * dv;
  const SequenceSpan span = sequence_span(p, b);
  simt_load_state(p.initial_state, p.initial_key_sum, b, hk, dk, dv, s, z);
  __syncthreads();
  if (!p.causal) {
    for (int t = 0; t < span.length; ++t) {
      simt_load_key<T>(p, b, span, t, hk, phi_k, nullptr, v);
      __syncthreads();
      simt_add_outer(dk, dv, phi_k, v, s, z);
      __syncthreads();
    }
  }
  for (int t = 0; t < span.length; ++t) {
    if (p.causal) {
      simt_load_key<T>(p, b, span, t, hk, phi_k, nullptr, v);
      __syncthreads();
      simt_add_outer(dk, dv, phi_k, v, s, z);
    }
    for (int g = 0; g < p.group; ++g) {
      const int h = hk * p.group + g;
      __syncthreads();  // S updated; phi_q free
      simt_load_query<T>(p, b, span, t, h, phi_q, nullptr);
      __syncthreads();
      float den = 1.0f;
      if (p.normalize) {
        float part = 0.0f;
        for (int i = threadIdx.x; i < dk; i += kSimtThreads) part += phi_q[i] * z[i];
        den = block_sum(part, reduce) + kLinearNormalizerEps;
      }
      T* out_row = row_pointer<T>(p.out, b, span, t, h);
      for (int j = threadIdx.x; j < dv; j += kSimtThreads) {
        float num = 0.0f;
#pragma unroll 4
        for (int i = 0; i < dk; ++i) num += phi_q[i] * s[i * dv + j];
        store_float(out_row + j, p.normalize ? num / den : num);
      }
    }
    __syncthreads();  // before the next token's keys overwrite phi_k, v
  }
  simt_store_state(p.final_state, p.final_key_sum, b, hk, dk, dv, s, z);
}

// Workspace of the SIMT backward: dnum [rows, Hq, Dv] and dden [rows, Hq], fp32,
// rows = B * S (dense) or the packed rows (varlen).
struct SimtBackwardScratch {
  float* dnum;
  float* dden;
};

template <typename T>
__global__ void __launch_bounds__(kSimtThreads) linear_simt_backward_kernel(LinearParams p, SimtBackwardScratch w) {
  extern __shared__ float smem[];
  const int hk = blockIdx.x, b = blockIdx.y;
  const int dk = p.key_dim, dv = p.value_dim;
  float* s = smem;  // S in the forward sweep, G in the reverse one
  float* z = s + dk * dv;
  float* phi_k = z + dk;  // also φq's raw values in the forward sweep
  float* phi_q = phi_k + dk;
  float* v = phi_q + dk;  // v, then dout, then dnum / num
  float* dout = v + dv;
  float* dnum = dout + dv;
  float* reduce = dnum + dv;
  float* raw = phi_k;  // raw q (forward sweep) or raw k (reverse sweep): φ'(x) needs x
  float* raw_k = phi_q;
  const SequenceSpan span = sequence_span(p, b);

  // ---- forward sweep: S_t, z_t; dnum, dden to the workspace; dq.
  simt_load_state(p.initial_state, p.initial_key_sum, b, hk, dk, dv, s, z);
  __syncthreads();
  for (int pass = p.causal ? 1 : 0; pass < 2; ++pass) {
    for (int t = 0; t < span.length; ++t) {
      if (pass == 0 || p.causal) {
        simt_load_key<T>(p, b, span, t, hk, phi_k, nullptr, v);
        __syncthreads();
        simt_add_outer(dk, dv, phi_k, v, s, z);
        __syncthreads();
      }
      if (pass == 0) continue;
      for (int g = 0; g < p.group; ++g) {
        const int h = hk * p.group + g;
        simt_load_query<T>(p, b, span, t, h, phi_q, raw);
        const T* dout_row = row_pointer<const T>(p.dout, b, span, t, h);
        for (int j = threadIdx.x; j < dv; j += kSimtThreads) dout[j] = load_float(dout_row + j);
        __syncthreads();
        float num_dot_dout = 0.0f;
        for (int j = threadIdx.x; j < dv; j += kSimtThreads) {
          float num = 0.0f;
          for (int i = 0; i < dk; ++i) num += phi_q[i] * s[i * dv + j];
          num_dot_dout += num * dout[j];
        }
        float den = 1.0f, dden = 0.0f;
        if (p.normalize) {
          float part = 0.0f;
          for (int i = threadIdx.x; i < dk; i += kSimtThreads) part += phi_q[i] * z[i];
          den = block_sum(part, reduce) + kLinearNormalizerEps;
          dden = -block_sum(num_dot_dout, reduce) / (den * den);
        }
        const std::int64_t row = packed_row(p, b, span, t);
        for (int j = threadIdx.x; j < dv; j += kSimtThreads) {
          dnum[j] = p.normalize ? dout[j] / den : dout[j];
          w.dnum[(row * p.heads_q + h) * dv + j] = dnum[j];
        }
        if (threadIdx.x == 0) w.dden[row * p.heads_q + h] = dden;
        __syncthreads();
        T* dq_row = row_pointer<T>(p.dq, b, span, t, h);
        for (int i = threadIdx.x; i < dk; i += kSimtThreads) {
          float acc = dden * z[i];
          for (int j = 0; j < dv; ++j) acc += s[i * dv + j] * dnum[j];
          store_float(dq_row + i, p.scale * feature_derivative(p.map, raw[i]) * acc);
        }
        __syncthreads();
      }
    }
  }

  // ---- reverse sweep: G, g; dk, dv. The forward sweep's writes to the workspace
  // are visible to this CTA after the barrier (same CTA).
  __syncthreads();
  simt_load_state(p.dfinal_state, p.dfinal_key_sum, b, hk, dk, dv, s, z);
  __syncthreads();
  auto add_rows_to_gradient_state = [&](int t) {
    const std::int64_t row = packed_row(p, b, span, t);
    for (int g = 0; g < p.group; ++g) {
      const int h = hk * p.group + g;
      simt_load_query<T>(p, b, span, t, h, phi_q, nullptr);
      for (int j = threadIdx.x; j < dv; j += kSimtThreads) dnum[j] = w.dnum[(row * p.heads_q + h) * dv + j];
      const float dden = w.dden[row * p.heads_q + h];
      __syncthreads();
      for (int e = threadIdx.x; e < dk * dv; e += kSimtThreads) s[e] += phi_q[e / dv] * dnum[e % dv];
      for (int i = threadIdx.x; i < dk; i += kSimtThreads) z[i] += dden * phi_q[i];
      __syncthreads();
    }
  };
  auto write_key_gradients = [&](int t) {
    simt_load_key<T>(p, b, span, t, hk, phi_k, raw_k, v);
    __syncthreads();
    T* dk_row = row_pointer<T>(p.dk, b, span, t, hk);
    T* dv_row = row_pointer<T>(p.dv, b, span, t, hk);
    for (int i = threadIdx.x; i < dk; i += kSimtThreads) {
      float acc = z[i];
      for (int j = 0; j < dv; ++j) acc += s[i * dv + j] * v[j];
      store_float(dk_row + i, feature_derivative(p.map, raw_k[i]) * acc);
    }
    for (int j = threadIdx.x; j < dv; j += kSimtThreads) {
      float acc = 0.0f;
      for (int i = 0; i < dk; ++i) acc += s[i * dv + j] * phi_k[i];
      store_float(dv_row + j, acc);
    }
    __syncthreads();
  };
  if (p.causal) {
    for (int t = span.length - 1; t >= 0; --t) {
      add_rows_to_gradient_state(t);
      write_key_gradients(t);
    }
  } else {
    for (int t = 0; t < span.length; ++t) add_rows_to_gradient_state(t);
    for (int t = 0; t < span.length; ++t) write_key_gradients(t);
  }
  simt_store_state(p.dinitial_state, p.dinitial_key_sum, b, hk, dk, dv, s, z);
}

}  // namespace cuflash::detail::linear
