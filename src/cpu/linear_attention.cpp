// Linear attention on the CPU (docs/linear.md): the chunked algorithm that the
// GPU kernels will run, in fp32. A sequence is cut into chunks of kChunk rows;
// inside a chunk the causal part is quadratic (scores φq_t·φk_s for s <= t),
// and what came before arrives through the fp32 state S (Dk x Dv) and key sum
// z (Dk) carried from chunk to chunk:
//   num_t = Sᵀ φq_t + Σ_{s<=t in chunk} (φq_t·φk_s) v_s
//   den_t = φq_t·z + Σ_{s<=t in chunk} φq_t·φk_s + eps          (normalize)
// One work item is a (sequence, kv head): the state belongs to the kv head, so
// it is built once for the group's query heads, and the item owns every dk/dv
// row and state element it writes (no atomics: results do not depend on the
// thread count).
//
// Backward (G, g: the gradients arriving at S and z from later rows):
//   dnum_t = dout_t / den_t, dden_t = -(dout_t·num_t) / den_t²   (normalize; else dout_t and 0)
//   dφq_t  = S dnum_t + dden_t z + Σ_{s<=t} (v_s·dnum_t + dden_t) φk_s
//   dφk_s  = G v_s + g + Σ_{t>=s} (v_s·dnum_t + dden_t) φq_t
//   dv_s   = Gᵀ φk_s + Σ_{t>=s} (φq_t·φk_s) dnum_t
// with G = dfinal_state + Σ_{later rows t} φq_t dnum_tᵀ and g = dfinal_key_sum +
// Σ_{later t} dden_t φq_t, built by a reverse pass over the chunks; a first,
// forward pass keeps the state at each chunk's start. dinitial_state is G after
// the whole sequence, dinitial_key_sum g. Non-causal: every row sees the
// sequence's total S and z, and G, g sum over all rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"
#include "linear_problem.hpp"
#include "parallel_for.hpp"
#include "tensor_access.hpp"

namespace cuflash::detail::cpu {
namespace {

constexpr int kChunk = 64;

float feature(FeatureMap map, float x) {
  switch (map) {
    case FeatureMap::identity: return x;
    case FeatureMap::elu_plus_one: return x > 0.0f ? x + 1.0f : std::exp(x);
    case FeatureMap::relu: return x > 0.0f ? x : 0.0f;
  }
  return x;
}

// dφ/dx (torch's convention at 0: relu' = 0, (elu+1)' = 1).
float feature_derivative(FeatureMap map, float x) {
  switch (map) {
    case FeatureMap::identity: return 1.0f;
    case FeatureMap::elu_plus_one: return x > 0.0f ? 1.0f : std::exp(x);
    case FeatureMap::relu: return x > 0.0f ? 1.0f : 0.0f;
  }
  return 1.0f;
}

float dot(const float* a, const float* b, int length) {
  float sum = 0.0f;
  for (int d = 0; d < length; ++d) sum += a[d] * b[d];
  return sum;
}

void axpy(float alpha, const float* x, float* y, int length) {
  for (int d = 0; d < length; ++d) y[d] += alpha * x[d];
}

// A q-like (q, out, dout, dq) or k-like (k, v, dk, dv) row: dense [b, t, head, :],
// varlen [cu_seqlens[b] + t, head, :].
std::int64_t row_offset(const LinearProblem& p, const TensorView& view, int b, int t, int head) {
  if (p.varlen) return (p.first_row(b) + t) * view.strides[0] + head * view.strides[1];
  return b * view.strides[0] + static_cast<std::int64_t>(t) * view.strides[1] + head * view.strides[2];
}

// Element (i, j) of a state [B, Hk, Dk, Dv], or element i of a key sum [B, Hk, Dk].
std::int64_t state_offset(const TensorView& view, int b, int hk, int i) {
  return b * view.strides[0] + hk * view.strides[1] + i * view.strides[2];
}

// Per-worker memory, sized once before the items run.
struct Scratch {
  std::vector<float> state, key_sum;              // S [Dk * Dv], z [Dk]
  std::vector<float> chunk_states, chunk_key_sums;  // backward: S and z at each chunk's start
  std::vector<float> grad_state, grad_key_sum;    // backward: G, g
  std::vector<float> delta_state, delta_key_sum;  // backward: one chunk's additions to G, g
  std::vector<float> raw_k, phi_k, value;         // the chunk's keys [kChunk * Dk], values [kChunk * Dv]
  std::vector<float> raw_q, phi_q, dout;          // one query head's chunk rows
  std::vector<float> scores, dscores;             // [kChunk * kChunk]: φq_t·φk_s and v_s·dnum_t + dden_t
  std::vector<float> num, dnum;                   // [kChunk * Dv]
  std::vector<float> den, dden;                   // [kChunk]
  std::vector<float> dphi_k, dvalue;              // backward: the chunk's dφk, dv
  std::vector<float> row;                         // one row of max(Dk, Dv)

  Scratch(const LinearProblem& p, bool backward) {
    const std::size_t dk = p.key_dim, dv = p.value_dim, c = kChunk;
    state.resize(dk * dv);
    key_sum.resize(dk);
    raw_k.resize(c * dk);
    phi_k.resize(c * dk);
    value.resize(c * dv);
    raw_q.resize(c * dk);
    phi_q.resize(c * dk);
    scores.resize(c * c);
    num.resize(c * dv);
    den.resize(c);
    row.resize(std::max(dk, dv));
    if (!backward) return;
    const std::size_t chunks = p.causal ? (static_cast<std::size_t>(p.max_len) + c - 1) / c : 0;
    chunk_states.resize(chunks * dk * dv);
    chunk_key_sums.resize(chunks * dk);
    grad_state.resize(dk * dv);
    grad_key_sum.resize(dk);
    delta_state.resize(dk * dv);
    delta_key_sum.resize(dk);
    dout.resize(c * dv);
    dscores.resize(c * c);
    dnum.resize(c * dv);
    dden.resize(c);
    dphi_k.resize(c * dk);
    dvalue.resize(c * dv);
  }
};

// A state-shaped input (or 0 when not given) into S [Dk * Dv] and z [Dk].
void load_state(const LinearProblem& p, const TensorView& state, const TensorView& key_sum, int b, int hk, float* s,
                float* z) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int i = 0; i < dk; ++i) {
    float* s_row = s + static_cast<std::int64_t>(i) * dv;
    if (state.empty()) std::fill_n(s_row, dv, 0.0f);
    else std::copy_n(static_cast<const float*>(state.data) + state_offset(state, b, hk, i), dv, s_row);
  }
  if (key_sum.empty()) std::fill_n(z, dk, 0.0f);
  else std::copy_n(static_cast<const float*>(key_sum.data) + state_offset(key_sum, b, hk, 0), dk, z);
}

void store_state(const LinearProblem& p, const TensorView& state, const TensorView& key_sum, int b, int hk,
                 const float* s, const float* z) {
  const int dk = p.key_dim, dv = p.value_dim;
  if (!state.empty())
    for (int i = 0; i < dk; ++i)
      std::copy_n(s + static_cast<std::int64_t>(i) * dv, dv, static_cast<float*>(state.data) + state_offset(state, b, hk, i));
  if (!key_sum.empty()) std::copy_n(z, dk, static_cast<float*>(key_sum.data) + state_offset(key_sum, b, hk, 0));
}

// Rows [first, first + count) of kv head hk: k (raw and φ(k)) and v.
void load_keys(const LinearProblem& p, int b, int hk, int first, int count, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int s = 0; s < count; ++s) {
    float* raw = w.raw_k.data() + s * dk;
    float* phi = w.phi_k.data() + s * dk;
    load_row(p.k, row_offset(p, p.k, b, first + s, hk), dk, raw);
    for (int d = 0; d < dk; ++d) phi[d] = feature(p.feature_map, raw[d]);
    load_row(p.v, row_offset(p, p.v, b, first + s, hk), dv, w.value.data() + s * dv);
  }
}

// Rows [first, first + count) of query head h: q and φq = scale·φ(q) (and dout for the backward).
void load_queries(const LinearProblem& p, int b, int h, int first, int count, bool with_dout, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int t = 0; t < count; ++t) {
    float* raw = w.raw_q.data() + t * dk;
    float* phi = w.phi_q.data() + t * dk;
    load_row(p.q, row_offset(p, p.q, b, first + t, h), dk, raw);
    for (int d = 0; d < dk; ++d) phi[d] = p.scale * feature(p.feature_map, raw[d]);
    if (with_dout) load_row(p.dout, row_offset(p, p.dout, b, first + t, h), dv, w.dout.data() + t * dv);
  }
}

// S += Σ_s φk_s v_sᵀ, z += Σ_s φk_s over the chunk's count rows.
void add_chunk_to_state(const LinearProblem& p, int count, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int s = 0; s < count; ++s) {
    const float* phi = w.phi_k.data() + s * dk;
    const float* v = w.value.data() + s * dv;
    for (int i = 0; i < dk; ++i) axpy(phi[i], v, w.state.data() + static_cast<std::int64_t>(i) * dv, dv);
    axpy(1.0f, phi, w.key_sum.data(), dk);
  }
}

// out[j] = Σ_i phi[i] state[i][j]: φqᵀ S.
void state_product(const float* state, const float* phi, int dk, int dv, float* out) {
  std::fill_n(out, dv, 0.0f);
  for (int i = 0; i < dk; ++i) axpy(phi[i], state + static_cast<std::int64_t>(i) * dv, out, dv);
}

// num_t and den_t (before eps) of the chunk's rows for the query head in w.phi_q,
// against the state in (s, z) at the chunk's start; with `causal`, the chunk's
// own keys s <= t join (their scores kept in w.scores).
void chunk_numerators(const LinearProblem& p, int count, const float* s, const float* z, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int t = 0; t < count; ++t) {
    const float* phi = w.phi_q.data() + t * dk;
    float* num = w.num.data() + t * dv;
    state_product(s, phi, dk, dv, num);
    float den = p.normalize ? dot(phi, z, dk) : 0.0f;
    if (p.causal) {
      for (int key = 0; key <= t; ++key) {
        const float score = dot(phi, w.phi_k.data() + key * dk, dk);
        w.scores[t * kChunk + key] = score;
        axpy(score, w.value.data() + key * dv, num, dv);
        den += score;
      }
    }
    w.den[t] = den + kLinearNormalizerEps;
  }
}

void write_output_rows(const LinearProblem& p, int b, int h, int first, int count, Scratch& w) {
  const int dv = p.value_dim;
  for (int t = 0; t < count; ++t) {
    float* num = w.num.data() + t * dv;
    if (p.normalize)
      for (int j = 0; j < dv; ++j) num[j] /= w.den[t];
    store_row(p.out, row_offset(p, p.out, b, first + t, h), dv, num);
  }
}

void forward_item(const LinearProblem& p, int b, int hk, Scratch& w) {
  const int len = p.seq_len(b);
  const int group = p.group_size();
  load_state(p, p.initial_state, p.initial_key_sum, b, hk, w.state.data(), w.key_sum.data());
  if (!p.causal) {
    for (int first = 0; first < len; first += kChunk) {
      const int count = std::min(kChunk, len - first);
      load_keys(p, b, hk, first, count, w);
      add_chunk_to_state(p, count, w);
    }
  }
  for (int first = 0; first < len; first += kChunk) {
    const int count = std::min(kChunk, len - first);
    if (p.causal) load_keys(p, b, hk, first, count, w);
    for (int g = 0; g < group; ++g) {
      const int h = hk * group + g;
      load_queries(p, b, h, first, count, false, w);
      chunk_numerators(p, count, w.state.data(), w.key_sum.data(), w);
      write_output_rows(p, b, h, first, count, w);
    }
    if (p.causal) add_chunk_to_state(p, count, w);
  }
  store_state(p, p.final_state, p.final_key_sum, b, hk, w.state.data(), w.key_sum.data());
}

// dnum_t, dden_t of the chunk's rows from w.num, w.den and w.dout.
void output_gradients(const LinearProblem& p, int count, Scratch& w) {
  const int dv = p.value_dim;
  for (int t = 0; t < count; ++t) {
    const float* dout = w.dout.data() + t * dv;
    float* dnum = w.dnum.data() + t * dv;
    if (!p.normalize) {
      std::copy_n(dout, dv, dnum);
      w.dden[t] = 0.0f;
      continue;
    }
    const float den = w.den[t];
    for (int j = 0; j < dv; ++j) dnum[j] = dout[j] / den;
    w.dden[t] = -dot(dout, w.num.data() + t * dv, dv) / (den * den);
  }
}

// dq_t = scale·φ'(q_t) ⊙ dφq_t with dφq_t = S dnum_t + dden_t z (+ the chunk's
// own keys when causal: Σ_{s<=t} (v_s·dnum_t + dden_t) φk_s, kept in w.dscores).
void write_query_gradients(const LinearProblem& p, int b, int h, int first, int count, const float* s, const float* z,
                           Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  float* dphi = w.row.data();
  for (int t = 0; t < count; ++t) {
    const float* dnum = w.dnum.data() + t * dv;
    for (int i = 0; i < dk; ++i) dphi[i] = dot(s + static_cast<std::int64_t>(i) * dv, dnum, dv);
    axpy(w.dden[t], z, dphi, dk);
    if (p.causal) {
      for (int key = 0; key <= t; ++key) {
        const float weight = dot(w.value.data() + key * dv, dnum, dv) + w.dden[t];
        w.dscores[t * kChunk + key] = weight;
        axpy(weight, w.phi_k.data() + key * dk, dphi, dk);
      }
    }
    const float* raw = w.raw_q.data() + t * dk;
    for (int i = 0; i < dk; ++i) dphi[i] *= p.scale * feature_derivative(p.feature_map, raw[i]);
    store_row(p.dq, row_offset(p, p.dq, b, first + t, h), dk, dphi);
  }
}

// G += Σ_t φq_t dnum_tᵀ and g += Σ_t dden_t φq_t over the chunk's rows (into `state`, `key_sum`).
void add_row_gradients_to_state(const LinearProblem& p, int count, float* state, float* key_sum, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int t = 0; t < count; ++t) {
    const float* phi = w.phi_q.data() + t * dk;
    const float* dnum = w.dnum.data() + t * dv;
    for (int i = 0; i < dk; ++i) axpy(phi[i], dnum, state + static_cast<std::int64_t>(i) * dv, dv);
    axpy(w.dden[t], phi, key_sum, dk);
  }
}

// The chunk's dφk_s += G v_s + g and dv_s += Gᵀ φk_s, then dk = φ'(k) ⊙ dφk and dv stored.
void write_key_gradients(const LinearProblem& p, int b, int hk, int first, int count, Scratch& w) {
  const int dk = p.key_dim, dv = p.value_dim;
  for (int s = 0; s < count; ++s) {
    float* dphi = w.dphi_k.data() + s * dk;
    float* dvalue = w.dvalue.data() + s * dv;
    const float* v = w.value.data() + s * dv;
    const float* phi = w.phi_k.data() + s * dk;
    for (int i = 0; i < dk; ++i) {
      const float* g_row = w.grad_state.data() + static_cast<std::int64_t>(i) * dv;
      dphi[i] += dot(g_row, v, dv) + w.grad_key_sum[i];
      axpy(phi[i], g_row, dvalue, dv);
    }
    const float* raw = w.raw_k.data() + s * dk;
    for (int i = 0; i < dk; ++i) dphi[i] *= feature_derivative(p.feature_map, raw[i]);
    store_row(p.dk, row_offset(p, p.dk, b, first + s, hk), dk, dphi);
    store_row(p.dv, row_offset(p, p.dv, b, first + s, hk), dv, dvalue);
  }
}

void backward_item(const LinearProblem& p, int b, int hk, Scratch& w) {
  const int len = p.seq_len(b);
  const int group = p.group_size();
  const int dk = p.key_dim, dv = p.value_dim;
  const std::int64_t state_size = static_cast<std::int64_t>(dk) * dv;
  load_state(p, p.initial_state, p.initial_key_sum, b, hk, w.state.data(), w.key_sum.data());
  // The forward pass over the keys: the state at each chunk's start (causal), or the total.
  for (int first = 0, chunk = 0; first < len; first += kChunk, ++chunk) {
    const int count = std::min(kChunk, len - first);
    if (p.causal) {
      std::copy_n(w.state.data(), state_size, w.chunk_states.data() + chunk * state_size);
      std::copy_n(w.key_sum.data(), dk, w.chunk_key_sums.data() + static_cast<std::int64_t>(chunk) * dk);
    }
    load_keys(p, b, hk, first, count, w);
    add_chunk_to_state(p, count, w);
  }
  load_state(p, p.dfinal_state, p.dfinal_key_sum, b, hk, w.grad_state.data(), w.grad_key_sum.data());

  if (!p.causal) {
    // Every row reads the total state: dq row by row, and G, g summed over all rows.
    for (int first = 0; first < len; first += kChunk) {
      const int count = std::min(kChunk, len - first);
      for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        load_queries(p, b, h, first, count, true, w);
        chunk_numerators(p, count, w.state.data(), w.key_sum.data(), w);
        output_gradients(p, count, w);
        write_query_gradients(p, b, h, first, count, w.state.data(), w.key_sum.data(), w);
        add_row_gradients_to_state(p, count, w.grad_state.data(), w.grad_key_sum.data(), w);
      }
    }
    for (int first = 0; first < len; first += kChunk) {
      const int count = std::min(kChunk, len - first);
      load_keys(p, b, hk, first, count, w);
      std::fill_n(w.dphi_k.data(), count * dk, 0.0f);
      std::fill_n(w.dvalue.data(), count * dv, 0.0f);
      write_key_gradients(p, b, hk, first, count, w);
    }
  } else {
    const int chunks = (len + kChunk - 1) / kChunk;
    for (int chunk = chunks - 1; chunk >= 0; --chunk) {
      const int first = chunk * kChunk;
      const int count = std::min(kChunk, len - first);
      const float* s = w.chunk_states.data() + chunk * state_size;
      const float* z = w.chunk_key_sums.data() + static_cast<std::int64_t>(chunk) * dk;
      load_keys(p, b, hk, first, count, w);
      std::fill_n(w.dphi_k.data(), count * dk, 0.0f);
      std::fill_n(w.dvalue.data(), count * dv, 0.0f);
      std::fill(w.delta_state.begin(), w.delta_state.end(), 0.0f);
      std::fill(w.delta_key_sum.begin(), w.delta_key_sum.end(), 0.0f);
      for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        load_queries(p, b, h, first, count, true, w);
        chunk_numerators(p, count, s, z, w);
        output_gradients(p, count, w);
        write_query_gradients(p, b, h, first, count, s, z, w);
        // The chunk's own pairs t >= s.
        for (int t = 0; t < count; ++t) {
          const float* phi_q = w.phi_q.data() + t * dk;
          const float* dnum = w.dnum.data() + t * dv;
          for (int key = 0; key <= t; ++key) {
            axpy(w.dscores[t * kChunk + key], phi_q, w.dphi_k.data() + key * dk, dk);
            axpy(w.scores[t * kChunk + key], dnum, w.dvalue.data() + key * dv, dv);
          }
        }
        add_row_gradients_to_state(p, count, w.delta_state.data(), w.delta_key_sum.data(), w);
      }
      // The rows after this chunk, through G and g; then this chunk's rows join them.
      write_key_gradients(p, b, hk, first, count, w);
      axpy(1.0f, w.delta_state.data(), w.grad_state.data(), static_cast<int>(state_size));
      axpy(1.0f, w.delta_key_sum.data(), w.grad_key_sum.data(), dk);
    }
  }
  store_state(p, p.dinitial_state, p.dinitial_key_sum, b, hk, w.grad_state.data(), w.grad_key_sum.data());
}

// Packed varlen rows after the last sequence belong to none: their gradients are 0.
void zero_unowned_rows(const LinearProblem& p) {
  if (!p.varlen) return;
  const std::int64_t total = p.q.shape[0];
  for (std::int64_t row = p.host_cu_seqlens.back(); row < total; ++row) {
    for (int h = 0; h < p.heads_q; ++h) store_zero_row(p.dq, row * p.dq.strides[0] + h * p.dq.strides[1], p.key_dim);
    for (int h = 0; h < p.heads_kv; ++h) {
      store_zero_row(p.dk, row * p.dk.strides[0] + h * p.dk.strides[1], p.key_dim);
      store_zero_row(p.dv, row * p.dv.strides[0] + h * p.dv.strides[1], p.value_dim);
    }
  }
}

template <typename Item>
void run_items(const LinearProblem& p, bool backward, Item item) {
  const std::int64_t items = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  if (items == 0) return;
  std::vector<Scratch> scratch;
  const int workers = worker_count(items);
  scratch.reserve(workers);
  for (int worker = 0; worker < workers; ++worker) scratch.emplace_back(p, backward);
  parallel_for(items, [&](std::int64_t index, int worker) {
    item(p, static_cast<int>(index / p.heads_kv), static_cast<int>(index % p.heads_kv), scratch[worker]);
  });
}

}  // namespace

void run_linear_forward(const LinearProblem& problem) { run_items(problem, false, forward_item); }

void run_linear_backward(const LinearProblem& problem) {
  run_items(problem, true, backward_item);
  zero_unowned_rows(problem);
}

}  // namespace cuflash::detail::cpu
