// The float64 oracle of linear attention: each output row is the sum over the
// keys it sees, pair by pair (weight φq_t·φk_s), plus the initial state's
// share; the final state is summed key by key. No chunking, no carried state,
// nothing shared with the backend, so that a bug there cannot hide here.
// The backward differentiates the same pairwise sums by hand.
#include "linear_oracle.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "half_convert.hpp"
#include "linear_problem.hpp"
#include "tensor_access.hpp"
#include "validate.hpp"

namespace cuflash::oracle {
namespace {

using detail::cpu::load_element_f64;

using detail::LinearProblem;
using Rows = std::vector<std::vector<double>>;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Row t of sequence b, head `head`: dense [b, t, head, :], varlen [cu_seqlens[b] + t, head, :].
std::int64_t packed_row(const LinearProblem& p, int b, int t) {
  return p.varlen ? static_cast<std::int64_t>(p.host_cu_seqlens[b]) + t : t;
}

std::vector<double> load_row(const LinearProblem& p, const TensorView& view, int b, int t, int head) {
  const std::int64_t base = p.varlen ? packed_row(p, b, t) * view.strides[0] + head * view.strides[1]
                                     : b * view.strides[0] + t * view.strides[1] + head * view.strides[2];
  const int length = static_cast<int>(view.shape[view.rank - 1]);
  std::vector<double> row(length);
  for (int d = 0; d < length; ++d) row[d] = load_element_f64(view, base + d);
  return row;
}

// Index of element 0 of that row in the view's logical row-major order.
std::int64_t logical_row(const LinearProblem& p, const TensorView& view, int b, int t, int head) {
  if (p.varlen) return (packed_row(p, b, t) * view.shape[1] + head) * view.shape[2];
  return ((b * view.shape[1] + t) * view.shape[2] + head) * view.shape[3];
}

std::int64_t numel(const TensorView& view) {
  std::int64_t n = 1;
  for (int d = 0; d < view.rank; ++d) n *= view.shape[d];
  return n;
}

double phi(FeatureMap map, double x) {
  switch (map) {
    case FeatureMap::identity: return x;
    case FeatureMap::elu_plus_one: return x > 0.0 ? x + 1.0 : std::exp(x);
    case FeatureMap::relu: return x > 0.0 ? x : 0.0;
  }
  return kNaN;
}

double phi_derivative(FeatureMap map, double x) {
  switch (map) {
    case FeatureMap::identity: return 1.0;
    case FeatureMap::elu_plus_one: return x > 0.0 ? 1.0 : std::exp(x);
    case FeatureMap::relu: return x > 0.0 ? 1.0 : 0.0;
  }
  return kNaN;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (std::size_t d = 0; d < a.size(); ++d) sum += a[d] * b[d];
  return sum;
}

std::vector<double> mapped(FeatureMap map, double scale, const std::vector<double>& raw) {
  std::vector<double> out(raw.size());
  for (std::size_t d = 0; d < raw.size(); ++d) out[d] = scale * phi(map, raw[d]);
  return out;
}

// A state [Dk][Dv] (or key sum [Dk] as one row) of (b, hk) from a view, 0 when not given.
Rows load_state(const LinearProblem& p, const TensorView& view, int b, int hk) {
  Rows state(p.key_dim, std::vector<double>(p.value_dim, 0.0));
  if (view.empty()) return state;
  for (int i = 0; i < p.key_dim; ++i)
    for (int j = 0; j < p.value_dim; ++j)
      state[i][j] = load_element_f64(view, b * view.strides[0] + hk * view.strides[1] + i * view.strides[2] + j);
  return state;
}

std::vector<double> load_key_sum(const LinearProblem& p, const TensorView& view, int b, int hk) {
  std::vector<double> sum(p.key_dim, 0.0);
  if (view.empty()) return sum;
  for (int i = 0; i < p.key_dim; ++i) sum[i] = load_element_f64(view, b * view.strides[0] + hk * view.strides[1] + i);
  return sum;
}

std::int64_t state_index(const LinearProblem& p, int b, int hk) {
  return (static_cast<std::int64_t>(b) * p.heads_kv + hk) * p.key_dim * p.value_dim;
}
std::int64_t key_sum_index(const LinearProblem& p, int b, int hk) {
  return (static_cast<std::int64_t>(b) * p.heads_kv + hk) * p.key_dim;
}

bool sees(const LinearProblem& p, int t, int s) { return !p.causal || s <= t; }

// The keys and values of (sequence b, kv head hk).
struct Keys {
  Rows raw, mapped, value;
};

Keys load_keys(const LinearProblem& p, int b, int hk) {
  Keys keys;
  for (int s = 0; s < p.seq_len(b); ++s) {
    keys.raw.push_back(load_row(p, p.k, b, s, hk));
    keys.mapped.push_back(mapped(p.feature_map, 1.0, keys.raw.back()));
    keys.value.push_back(load_row(p, p.v, b, s, hk));
  }
  return keys;
}

// Row t's numerator and denominator (eps included) for the mapped query fq.
struct RowSums {
  std::vector<double> num;
  double den = 0.0;
};

RowSums row_sums(const LinearProblem& p, const Keys& keys, const Rows& s0, const std::vector<double>& z0,
                 const std::vector<double>& fq, int t) {
  RowSums r;
  r.num.assign(p.value_dim, 0.0);
  for (int i = 0; i < p.key_dim; ++i)
    for (int j = 0; j < p.value_dim; ++j) r.num[j] += fq[i] * s0[i][j];
  r.den = dot(fq, z0);
  for (std::size_t s = 0; s < keys.raw.size(); ++s) {
    if (!sees(p, t, static_cast<int>(s))) continue;
    const double weight = dot(fq, keys.mapped[s]);
    for (int j = 0; j < p.value_dim; ++j) r.num[j] += weight * keys.value[s][j];
    r.den += weight;
  }
  r.den += static_cast<double>(kLinearNormalizerEps);
  return r;
}

Status require_host(const LinearProblem& p) {
  if (p.device.kind != DeviceKind::host) return Status::unsupported("float64 oracle: tensors must be in host memory");
  if (p.varlen && !p.host_indices_valid) return Status::unsupported("float64 oracle: cu_seqlens is not readable on the host");
  return Status::success();
}

}  // namespace

Status linear_forward_float64(const LinearForwardArgs& args, const LinearAttentionOptions& options,
                              LinearForwardResult* result) {
  LinearProblem p;
  CUFLASH_TRY(detail::validate_linear_forward(args, options, nullptr, &p));
  CUFLASH_TRY(require_host(p));
  const std::int64_t states = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  result->out.assign(numel(p.out), kNaN);
  result->final_state.assign(states * p.key_dim * p.value_dim, 0.0);
  result->final_key_sum.assign(states * p.key_dim, 0.0);
  const int group = p.heads_kv == 0 ? 0 : p.heads_q / p.heads_kv;
  for (int b = 0; b < p.batch; ++b) {
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      const Keys keys = load_keys(p, b, hk);
      const Rows s0 = load_state(p, p.initial_state, b, hk);
      const std::vector<double> z0 = load_key_sum(p, p.initial_key_sum, b, hk);
      for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        for (int t = 0; t < p.seq_len(b); ++t) {
          const std::vector<double> fq = mapped(p.feature_map, p.scale, load_row(p, p.q, b, t, h));
          const RowSums r = row_sums(p, keys, s0, z0, fq, t);
          const std::int64_t base = logical_row(p, p.out, b, t, h);
          for (int j = 0; j < p.value_dim; ++j) result->out[base + j] = p.normalize ? r.num[j] / r.den : r.num[j];
        }
      }
      double* state = result->final_state.data() + state_index(p, b, hk);
      double* key_sum = result->final_key_sum.data() + key_sum_index(p, b, hk);
      for (int i = 0; i < p.key_dim; ++i) {
        double sum = z0[i];
        for (const auto& k : keys.mapped) sum += k[i];
        key_sum[i] = sum;
        for (int j = 0; j < p.value_dim; ++j) {
          double total = s0[i][j];
          for (std::size_t s = 0; s < keys.raw.size(); ++s) total += keys.mapped[s][i] * keys.value[s][j];
          state[static_cast<std::int64_t>(i) * p.value_dim + j] = total;
        }
      }
    }
  }
  return Status::success();
}

Status linear_backward_float64(const LinearBackwardArgs& args, const LinearAttentionOptions& options,
                               LinearBackwardResult* result) {
  LinearProblem p;
  CUFLASH_TRY(detail::validate_linear_backward(args, options, nullptr, &p));
  CUFLASH_TRY(require_host(p));
  const std::int64_t states = static_cast<std::int64_t>(p.batch) * p.heads_kv;
  result->dq.assign(numel(p.q), 0.0);
  result->dk.assign(numel(p.k), 0.0);
  result->dv.assign(numel(p.v), 0.0);
  result->dinitial_state.assign(states * p.key_dim * p.value_dim, 0.0);
  result->dinitial_key_sum.assign(states * p.key_dim, 0.0);
  const int group = p.heads_kv == 0 ? 0 : p.heads_q / p.heads_kv;
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.seq_len(b);
    for (int hk = 0; hk < p.heads_kv; ++hk) {
      const Keys keys = load_keys(p, b, hk);
      const Rows s0 = load_state(p, p.initial_state, b, hk);
      const std::vector<double> z0 = load_key_sum(p, p.initial_key_sum, b, hk);
      const Rows ds_final = load_state(p, p.dfinal_state, b, hk);
      const std::vector<double> dz_final = load_key_sum(p, p.dfinal_key_sum, b, hk);
      // The final state S_T = S_0 + Σ φk_s v_sᵀ and z_T = z_0 + Σ φk_s pass their gradients straight on.
      Rows ds0 = ds_final;
      std::vector<double> dz0 = dz_final;
      Rows dphi_k(len, std::vector<double>(p.key_dim, 0.0));
      Rows dvalue(len, std::vector<double>(p.value_dim, 0.0));
      for (int s = 0; s < len; ++s) {
        for (int i = 0; i < p.key_dim; ++i) {
          dphi_k[s][i] += dot(ds_final[i], keys.value[s]) + dz_final[i];
          for (int j = 0; j < p.value_dim; ++j) dvalue[s][j] += ds_final[i][j] * keys.mapped[s][i];
        }
      }
      for (int g = 0; g < group; ++g) {
        const int h = hk * group + g;
        for (int t = 0; t < len; ++t) {
          const std::vector<double> raw_q = load_row(p, p.q, b, t, h);
          const std::vector<double> fq = mapped(p.feature_map, p.scale, raw_q);
          const std::vector<double> dout = load_row(p, p.dout, b, t, h);
          const RowSums r = row_sums(p, keys, s0, z0, fq, t);
          // out = num / den (normalize) or num.
          std::vector<double> dnum = dout;
          double dden = 0.0;
          if (p.normalize) {
            for (double& x : dnum) x /= r.den;
            dden = -dot(dout, r.num) / (r.den * r.den);
          }
          // num = Σ_s w_ts v_s + S_0ᵀ fq, den = Σ_s w_ts + fq·z_0 + eps, w_ts = fq·φk_s.
          std::vector<double> dfq(p.key_dim, 0.0);
          for (int i = 0; i < p.key_dim; ++i) {
            dfq[i] = dot(s0[i], dnum) + dden * z0[i];
            for (int j = 0; j < p.value_dim; ++j) ds0[i][j] += fq[i] * dnum[j];
            dz0[i] += dden * fq[i];
          }
          for (int s = 0; s < len; ++s) {
            if (!sees(p, t, s)) continue;
            const double weight = dot(fq, keys.mapped[s]);
            const double dweight = dot(dnum, keys.value[s]) + dden;
            for (int i = 0; i < p.key_dim; ++i) {
              dfq[i] += dweight * keys.mapped[s][i];
              dphi_k[s][i] += dweight * fq[i];
            }
            for (int j = 0; j < p.value_dim; ++j) dvalue[s][j] += weight * dnum[j];
          }
          const std::int64_t base = logical_row(p, p.dq, b, t, h);
          for (int i = 0; i < p.key_dim; ++i)
            result->dq[base + i] = p.scale * phi_derivative(p.feature_map, raw_q[i]) * dfq[i];
        }
      }
      for (int s = 0; s < len; ++s) {
        const std::int64_t k_base = logical_row(p, p.dk, b, s, hk);
        const std::int64_t v_base = logical_row(p, p.dv, b, s, hk);
        for (int i = 0; i < p.key_dim; ++i)
          result->dk[k_base + i] = phi_derivative(p.feature_map, keys.raw[s][i]) * dphi_k[s][i];
        for (int j = 0; j < p.value_dim; ++j) result->dv[v_base + j] = dvalue[s][j];
      }
      double* dstate = result->dinitial_state.data() + state_index(p, b, hk);
      double* dkey_sum = result->dinitial_key_sum.data() + key_sum_index(p, b, hk);
      for (int i = 0; i < p.key_dim; ++i) {
        dkey_sum[i] = dz0[i];
        for (int j = 0; j < p.value_dim; ++j) dstate[static_cast<std::int64_t>(i) * p.value_dim + j] = ds0[i][j];
      }
    }
  }
  return Status::success();
}

}  // namespace cuflash::oracle
