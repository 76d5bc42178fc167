#include "attention_check.hpp"

#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace cuflash::test {
namespace {

// ----- error ledger -----------------------------------------------------

// The largest error per (dtype, backend, quantity), and the test that
// reached it: a process that runs many tests (a gtest shard) still says
// which one.
struct Worst {
  double value = 0.0;
  std::string test;
};

struct Ledger {
  std::mutex mutex;
  std::map<std::string, Worst> worst;
};

Ledger& ledger() {
  static Ledger l;
  return l;
}

class LedgerPrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::lock_guard<std::mutex> lock(ledger().mutex);
    if (ledger().worst.empty()) return;
    std::printf("[ cuflash ] largest errors against the float64 oracle:\n");
    for (const auto& [key, worst] : ledger().worst)
      std::printf("[ cuflash ]   %-28s %.3e %s\n", key.c_str(), worst.value, worst.test.c_str());
  }
};

[[maybe_unused]] ::testing::Environment* const ledger_printer =
    ::testing::AddGlobalTestEnvironment(new LedgerPrinter);

// ----- helpers ----------------------------------------------------------

// Compares a copy of a tensor taken before the call with the tensor now,
// element by element (NaN equal to NaN).
bool same_values(const HostTensor& before, const HostTensor& after, std::int64_t first, std::int64_t count) {
  for (std::int64_t e = first; e < first + count; ++e) {
    const double a = before.get(e), b = after.get(e);
    if (!(a == b || (std::isnan(a) && std::isnan(b)))) return false;
  }
  return true;
}

// One rounding to `dtype` away from `want` (a rotated key: the call rotates
// in fp32, the oracle in double, and both round once to the dtype).
bool within_one_rounding(double got, double want, DType dtype) {
  const double unit = dtype == DType::bf16 ? 0x1p-7 : dtype == DType::f16 ? 0x1p-10 : 0x1p-22;
  return std::abs(got - want) <= unit * std::abs(want) + 1e-5;
}

// After a KV-cache forward: append slots hold exactly k_new/v_new (with a
// rotary embedding, k the oracle's rotated k_new, `k_appended`, to one
// rounding), every other slot (cached keys, slack, guard pages, a leftpad's
// rows) is bit-identical to before.
void expect_cache_after_append(const AttentionCase& c, const HostTensor& k_before, const HostTensor& v_before,
                               const std::vector<double>& k_appended) {
  const CaseSpec& s = c.spec();
  const std::int64_t slots = c.k.shape()[1];
  const std::int64_t row = static_cast<std::int64_t>(s.heads_kv) * s.head_dim;
  // (cache row) -> (b, index in k_new)
  std::map<std::int64_t, std::pair<int, int>> appended;
  for (int b = 0; b < c.batch(); ++b)
    for (int n = 0; n < s.new_len; ++n) {
      const AttentionCase::CacheRow r = c.cache_row(b, s.cached_lens[b] + n);
      appended[r.outer * slots + r.pos] = {b, n};
    }
  int reported = 0;
  for (std::int64_t r = 0; r < c.k.shape()[0] * slots; ++r) {
    const auto it = appended.find(r);
    bool k_ok, v_ok;
    if (it == appended.end()) {
      k_ok = same_values(k_before, c.k, r * row, row);
      v_ok = same_values(v_before, c.v, r * row, row);
    } else {
      const std::int64_t src = (static_cast<std::int64_t>(it->second.first) * s.new_len + it->second.second) * row;
      k_ok = v_ok = true;
      for (std::int64_t e = 0; e < row; ++e) {
        const double k_got = c.k.get(r * row + e);
        k_ok = k_ok && (k_appended.empty() ? k_got == c.k_new.get(src + e)
                                           : within_one_rounding(k_got, k_appended[src + e], s.dtype));
        v_ok = v_ok && c.v.get(r * row + e) == c.v_new.get(src + e);
      }
    }
    if ((!k_ok || !v_ok) && reported++ < 5) {
      ADD_FAILURE() << "KV cache row (" << r / slots << ", " << r % slots << ") "
                    << (it == appended.end() ? "should be unchanged"
                                             : "should hold k_new/v_new[" + std::to_string(it->second.first) + ", " +
                                                   std::to_string(it->second.second) + "]")
                    << ": k " << (k_ok ? "ok" : "wrong") << ", v " << (v_ok ? "ok" : "wrong");
    }
  }
}

void expect_unchanged(const HostTensor& before, const HostTensor& after, const char* name) {
  EXPECT_TRUE(same_bytes(before, after)) << name << " was modified by the call";
}

// Whether `status` is ok; else adds a failure "<what> failed: <status>".
bool call_ok(const Status& status, const std::string& what) {
  if (status.ok()) return true;
  ADD_FAILURE() << what << " failed: " << status.to_string();
  return false;
}

bool within(const ErrorStats& e, double max_abs_rel, double rel_l2) {
  if (e.mismatches > 0) return false;
  if (max_abs_rel >= 0.0 && e.max_abs > max_abs_rel * e.ref_max_abs) return false;
  return e.rel_l2 <= rel_l2;
}

// dsinks[h] = -sum over rows of exp(sinks[h] - lse) * dot(dout, out), in
// float64 over the case's (rounded) out, lse and dout.
std::vector<double> dsinks_from_inputs(const AttentionCase& c) {
  const CaseSpec& s = c.spec();
  std::vector<double> dsinks(s.heads_q, 0.0);
  const bool varlen = s.layout == CaseLayout::varlen;
  std::int64_t first_row = 0;  // varlen: packed row of the sequence's first query
  for (int b = 0; b < c.batch(); ++b) {
    for (int i = 0; i < c.q_len(b); ++i) {
      for (int h = 0; h < s.heads_q; ++h) {
        const std::int64_t row = varlen ? first_row + i : static_cast<std::int64_t>(b) * s.q_len + i;
        const std::int64_t base = (row * s.heads_q + h) * s.head_dim;
        double delta = 0.0;
        for (int d = 0; d < s.head_dim; ++d) delta += c.dout.get(base + d) * c.out.get(base + d);
        const std::int64_t lse_index = varlen ? h * c.q.shape()[0] + first_row + i
                                              : (static_cast<std::int64_t>(b) * s.heads_q + h) * s.q_len + i;
        dsinks[h] -= std::exp(c.sinks.get(h) - c.lse.get(lse_index)) * delta;
      }
    }
    if (varlen) first_row += c.q_len(b);
  }
  return dsinks;
}

}  // namespace

void record_error(DType dtype, const char* quantity, double value, Backend backend) {
  std::lock_guard<std::mutex> lock(ledger().mutex);
  const std::string where = backend == Backend::automatic ? "" : std::string(backend_name(backend)) + " ";
  Worst& worst = ledger().worst[std::string(dtype_label(dtype)) + " " + where + quantity];
  if (!(value <= worst.value)) {  // NaN/inf stick
    worst.value = value;
    const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
    worst.test = test ? std::string(test->test_suite_name()) + "." + test->name() : "-";
  }
}

Tolerance default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f16: return {-1.0, 3e-3, 1e-5, 3e-3};
    case DType::bf16: return {-1.0, 1e-2, 1e-5, 1e-2};
    default: return {1e-5, 1e-5, 1e-5, 1e-5};
  }
}

Status HostApiRunner::forward(AttentionCase& c, const AttentionOptions& options) {
  return attention_forward(c.forward_args(), options);
}

Status HostApiRunner::backward(AttentionCase& c, const AttentionOptions& options) {
  return attention_backward(c.backward_args(), options);
}

ForwardErrors check_forward(AttentionCase& c, Runner& runner) {
  return check_forward(c, runner, default_tolerance(c.spec().dtype));
}

ForwardErrors check_forward(AttentionCase& c, Runner& runner, const Tolerance& tol) {
  ForwardErrors errors;
  const CaseSpec& s = c.spec();
  oracle::ForwardResult ref;
  // The oracle runs first and never modifies the cache; it reads appended keys from k_new.
  if (!call_ok(oracle::forward_float64(c.forward_args(), s.options, &ref), "oracle forward")) return errors;
  const HostTensor q_before = c.q, k_before = c.k, v_before = c.v;
  c.out.poison();
  if (!c.lse.empty()) c.lse.poison();

  const std::string what = std::string(backend_name(runner.backend())) + " forward";
  if (!call_ok(runner.forward(c, c.options(runner.backend())), what)) return errors;

  errors.out = compare(c.out, ref.out);
  EXPECT_TRUE(within(errors.out, tol.out_max_abs_rel, tol.out_rel_l2)) << "out: " << errors.out.describe();
  record_error(s.dtype, s.dtype == DType::f32 ? "out max_abs/scale" : "out rel_l2",
               s.dtype == DType::f32 ? errors.out.max_abs / std::max(errors.out.ref_max_abs, 1e-300)
                                     : errors.out.rel_l2,
               runner.backend());
  if (!c.lse.empty()) {
    errors.lse = compare(c.lse, ref.lse);
    EXPECT_TRUE(errors.lse.mismatches == 0 && errors.lse.max_abs_floor1 <= tol.lse_max_abs)
        << "lse: " << errors.lse.describe();
    record_error(s.dtype, "lse max_abs/max(1,|lse|)", errors.lse.max_abs_floor1, runner.backend());
  }

  expect_unchanged(q_before, c.q, "q");
  if (s.layout == CaseLayout::kv_cache) {
    expect_cache_after_append(c, k_before, v_before, ref.k_appended);
  } else {
    expect_unchanged(k_before, c.k, "k");
    expect_unchanged(v_before, c.v, "v");
  }
  return errors;
}

BackwardErrors check_backward(AttentionCase& c, Runner& runner) {
  return check_backward(c, runner, default_tolerance(c.spec().dtype));
}

BackwardErrors check_backward(AttentionCase& c, Runner& runner, const Tolerance& tol) {
  BackwardErrors errors;
  const CaseSpec& s = c.spec();
  oracle::ForwardResult fwd;
  if (!call_ok(oracle::forward_float64(c.forward_args(), s.options, &fwd), "oracle forward")) return errors;
  // The backward gets the exact forward, rounded as a forward would store it,
  // so that a forward bug cannot show up here.
  c.set_forward_outputs(fwd.out, fwd.lse);
  oracle::BackwardResult ref;
  if (!call_ok(oracle::backward_float64(c.backward_args(), s.options, &ref), "oracle backward")) return errors;
  const HostTensor q_before = c.q, k_before = c.k, v_before = c.v, out_before = c.out, dout_before = c.dout,
                   lse_before = c.lse;
  c.dq.poison();
  c.dk.poison();
  c.dv.poison();
  if (!c.dsinks.empty()) c.dsinks.poison();

  const std::string what = std::string(backend_name(runner.backend())) + " backward";
  if (!call_ok(runner.backward(c, c.options(runner.backend())), what)) return errors;
  // Exact zeros where no score contributes: dq of a query that sees no key
  // (its forward out is 0, or NaN for a row owned by no sequence), and dk/dv of
  // a key no query sees: a whole (key, head) row whose dk and dv are both 0.
  // Row-wise and both, because one element of a seen key's dv can cancel to
  // exactly 0 (GQA: one query per head over one key gives dv = sum of dO
  // values, and bf16 values can cancel), while its dk is not 0.
  std::vector<bool> dq_zero(ref.dq.size()), kv_zero(ref.dv.size());
  for (std::size_t i = 0; i < dq_zero.size(); ++i) dq_zero[i] = fwd.out[i] == 0.0 || std::isnan(fwd.out[i]);
  const std::size_t row_len = static_cast<std::size_t>(s.head_dim);
  for (std::size_t row = 0; row < kv_zero.size() / row_len; ++row) {
    bool unseen = true;
    for (std::size_t e = row * row_len; e < (row + 1) * row_len && unseen; ++e)
      unseen = ref.dv[e] == 0.0 && ref.dk[e] == 0.0;
    for (std::size_t e = row * row_len; e < (row + 1) * row_len; ++e) kv_zero[e] = unseen;
  }
  errors.dq = compare_zeros_where(c.dq, ref.dq, dq_zero);
  errors.dk = compare_zeros_where(c.dk, ref.dk, kv_zero);
  errors.dv = compare_zeros_where(c.dv, ref.dv, kv_zero);
  // A row's dS sums to 0, so its dq is a sum over keys whose terms cancel,
  // and the rounding of dS is relative to the terms (ref.dq_terms), not to
  // dq. At head dims 1 and 2 a row's dq is one or two such sums and its error
  // relative to |dq| has no bound: in a float64 model of the bf16 rounding
  // of dS (2 x 2 heads, 13 queries, 19 keys) above 1e-2 for 0.46 % of random
  // inputs at D = 1, above 2e-2 for 0.01 %; at D = 2 below 7.3e-3, at D >= 3
  // below 4.7e-3 (2e4 inputs each). Relative to the terms' norm the same
  // model stays below 2.1e-3 at D = 1, 8 and 64 alike. There dq's error is
  // taken relative to that norm.
  ErrorStats dq_checked = errors.dq;
  const char* dq_what = "dq: ";
  if (s.head_dim <= 2) {
    double ref_sq = 0.0, terms_sq = 0.0;
    for (std::size_t i = 0; i < ref.dq.size(); ++i)
      if (std::isfinite(ref.dq[i])) {
        ref_sq += ref.dq[i] * ref.dq[i];
        terms_sq += ref.dq_terms[i] * ref.dq_terms[i];
      }
    if (terms_sq > 0.0) dq_checked.rel_l2 = errors.dq.rel_l2 * std::sqrt(ref_sq / terms_sq);
    dq_what = "dq (rel_l2 relative to its terms' norm, head dim <= 2): ";
  }
  EXPECT_TRUE(within(dq_checked, -1.0, tol.grad_rel_l2)) << dq_what << dq_checked.describe();
  EXPECT_TRUE(within(errors.dk, -1.0, tol.grad_rel_l2)) << "dk: " << errors.dk.describe();
  EXPECT_TRUE(within(errors.dv, -1.0, tol.grad_rel_l2)) << "dv: " << errors.dv.describe();
  EXPECT_TRUE(all_written(c.dq, "dq"));
  EXPECT_TRUE(all_written(c.dk, "dk"));
  EXPECT_TRUE(all_written(c.dv, "dv"));
  record_error(s.dtype, "dq rel_l2", errors.dq.rel_l2, runner.backend());
  record_error(s.dtype, "dk rel_l2", errors.dk.rel_l2, runner.backend());
  record_error(s.dtype, "dv rel_l2", errors.dv.rel_l2, runner.backend());
  if (!c.dsinks.empty()) {
    // A sum over every row of its head, whose terms cancel: in f16/bf16 the
    // rounding of the given out alone moves it by more than the tolerance, so
    // there the reference is the same sum in float64 over the inputs the
    // backward was given (the oracle's own dsinks are checked in f32 here and
    // by finite differences in sinks_dropout_test.cpp).
    const std::vector<double> dsinks_ref = s.dtype == DType::f32 ? ref.dsinks : dsinks_from_inputs(c);
    errors.dsinks = compare_zeros_where(c.dsinks, dsinks_ref, std::vector<bool>(dsinks_ref.size(), false));
    EXPECT_TRUE(within(errors.dsinks, -1.0, tol.grad_rel_l2)) << "dsinks: " << errors.dsinks.describe();
    record_error(s.dtype, "dsinks rel_l2", errors.dsinks.rel_l2, runner.backend());
  }

  expect_unchanged(q_before, c.q, "q");
  expect_unchanged(k_before, c.k, "k");
  expect_unchanged(v_before, c.v, "v");
  expect_unchanged(out_before, c.out, "out");
  expect_unchanged(dout_before, c.dout, "dout");
  expect_unchanged(lse_before, c.lse, "lse");
  return errors;
}

}  // namespace cuflash::test
