// Attention sinks and dropout on the CPU backend, against the float64 oracle:
// forward and backward over every layout; dsinks by finite differences of the
// oracle itself; the Philox generator against its published known answers;
// the dropout mask's statistics, reproducibility and its decoding from the
// debug probabilities (attn_probs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/attention_check.hpp"
#include "philox.hpp"

namespace cuflash::test {
namespace {

using detail::dropout_keeps;
using detail::dropout_threshold16;
using detail::DropoutRng;
using detail::Philox4x32;
using detail::philox4x32_10;

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

// ----- Philox4x32-10 --------------------------------------------------------

// Known answers from the Random123 distribution (tests/kat_vectors).
TEST(Philox, KnownAnswers) {
  struct Vector {
    Philox4x32 counter;
    std::uint32_t key0, key1;
    Philox4x32 expected;
  };
  const Vector vectors[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const Vector& v : vectors) {
    const Philox4x32 got = philox4x32_10(v.counter, v.key0, v.key1);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.word[w], v.expected.word[w]) << "word " << w;
  }
}

TEST(Philox, DropoutThreshold16) {
  EXPECT_EQ(dropout_threshold16(0.0f), 0u);
  EXPECT_EQ(dropout_threshold16(0.5f), 0x8000u);
  EXPECT_EQ(dropout_threshold16(0.25f), 0x4000u);
  EXPECT_EQ(dropout_threshold16(0.1f), 6553u);                    // floor(0.1f * 65536)
  EXPECT_EQ(dropout_threshold16(1.0f / 131072.0f), 0u);           // p < 2^-16: nothing is dropped
  EXPECT_EQ(dropout_threshold16(1.0f / 65536.0f), 1u);
  EXPECT_EQ(dropout_threshold16(0.99999f), 0xFFFFu);              // 65535.34 -> clamped
  EXPECT_EQ(dropout_threshold16(0.999999940395f), 0xFFFFu);       // the largest float below 1
  EXPECT_EQ(dropout_threshold16(65534.5f / 65536.0f), 65534u);
}

// The mapping of docs/semantics.md, spelled out once more here so that a
// change to it has to change this test too: counter (j / 8, i, stream), key
// j's 16-bit draw is the low half of word (j % 8) / 2 for even j, the high
// half for odd j.
TEST(Philox, MaskMapping) {
  const DropoutRng rng{0x0123456789abcdefull, 0xfedcba9876543210ull, dropout_threshold16(0.5f)};
  const std::int64_t heads_q = 6, b = 3, h = 5, i = 17, j = 42;
  const std::uint64_t stream = rng.offset + static_cast<std::uint64_t>(b * heads_q + h);
  const Philox4x32 counter{{static_cast<std::uint32_t>(j / 8), static_cast<std::uint32_t>(i),
                             static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)}};
  const Philox4x32 draws = philox4x32_10(counter, 0x89abcdefu, 0x01234567u);
  auto draw16 = [&](std::int64_t key) {
    const std::uint32_t word = draws.word[(key % 8) / 2];
    return key % 2 == 0 ? (word & 0xFFFFu) : (word >> 16);
  };
  EXPECT_EQ(dropout_keeps(rng, b, h, heads_q, i, j), draw16(j) >= 0x8000u);
  std::uint32_t byte = 0;
  for (int key = 40; key < 48; ++key) {
    EXPECT_EQ(dropout_keeps(rng, b, h, heads_q, i, key), draw16(key) >= 0x8000u) << key;
    byte |= (draw16(key) >= 0x8000u ? 1u : 0u) << (key - 40);
  }
  EXPECT_EQ(detail::dropout_keep_byte(rng, stream, i, 40), byte);
}

// dropout_keep_byte (the eight keys of one Philox block, what the kernels
// use) agrees with dropout_keeps bit for bit, for random seeds, offsets,
// heads, rows, key groups and thresholds (0 and 65535 included).
TEST(Philox, KeepByteMatchesKeeps) {
  std::uint64_t state = 0x9E3779B97F4A7C15ull;
  auto next = [&] {  // splitmix64
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const std::vector<float> ps = {0.0f, 1.0f / 131072.0f, 1.0f / 65536.0f, 0.1f, 0.5f, 0.9f, 0.99999f,
                                 0.999999940395f};
  for (float p : ps) {
    const std::uint32_t threshold16 = dropout_threshold16(p);
    for (int trial = 0; trial < 2000; ++trial) {
      const DropoutRng rng{next(), next(), threshold16};
      const std::int64_t heads_q = 1 + static_cast<std::int64_t>(next() % 16);
      const std::int64_t b = static_cast<std::int64_t>(next() % 8), h = static_cast<std::int64_t>(next() % heads_q);
      const std::int64_t row = static_cast<std::int64_t>(next() % 100000);
      const std::int64_t first = 8 * static_cast<std::int64_t>(next() % 20000);
      const std::uint32_t byte = detail::dropout_keep_byte(rng, detail::dropout_stream(rng, b, h, heads_q), row, first);
      ASSERT_EQ(byte & ~0xFFu, 0u);
      for (int k = 0; k < 8; ++k)
        ASSERT_EQ(((byte >> k) & 1u) != 0, dropout_keeps(rng, b, h, heads_q, row, first + k))
            << "p " << p << " trial " << trial << " key " << k;
      if (threshold16 == 0u) ASSERT_EQ(byte, 0xFFu);
    }
  }
}

// The empirical keep fraction over ~1e6 draws (through dropout_keep_byte) is
// within 5 standard deviations of 1 - threshold16 / 65536, for thresholds
// including 0 (everything kept) and 65535 (one value in 65536 kept).
TEST(Philox, KeepByteFractionWithinBounds) {
  for (float p : {0.0f, 0.1f, 0.5f, 0.9f, 0.999999940395f}) {
    const std::uint32_t threshold16 = dropout_threshold16(p);
    const DropoutRng rng{0xC0FFEEull + static_cast<std::uint64_t>(p * 1000), 1234567ull, threshold16};
    std::int64_t kept = 0, n = 0;
    for (std::int64_t row = 0; row < 1024; ++row)
      for (std::int64_t group = 0; group < 128; ++group) {  // 1024 * 128 * 8 = 2^20 draws
        const std::uint32_t byte = detail::dropout_keep_byte(rng, detail::dropout_stream(rng, 1, 2, 3), row, 8 * group);
        for (int k = 0; k < 8; ++k) kept += (byte >> k) & 1u;
        n += 8;
      }
    const double q = 1.0 - threshold16 / 65536.0;  // keep probability
    const double mean = n * q, sd = std::sqrt(n * q * (1.0 - q));
    EXPECT_LE(std::abs(kept - mean), 5.0 * sd + 1e-9) << "p = " << p << ", kept " << kept << " of " << n;
    EXPECT_LE(std::abs(q - (1.0 - p)), 1.0 / 65536.0) << p;
  }
}

// Each entry is an independent Bernoulli draw: over n entries the kept count
// is within 6 standard deviations of n (1 - threshold16 / 65536) (a false
// alarm about 1 in 10^9), and so is each key class j % 8 (the 16-bit half of
// each Philox word).
TEST(Philox, KeepFractionWithinBounds) {
  for (float p : {0.1f, 0.5f, 0.9f}) {
    const DropoutRng rng{12345u + static_cast<std::uint64_t>(p * 100), 77u, dropout_threshold16(p)};
    const double q = 1.0 - dropout_threshold16(p) / 65536.0;
    std::int64_t kept = 0, n = 0;
    std::int64_t kept_by_lane[8] = {}, n_by_lane[8] = {};
    for (int b = 0; b < 3; ++b)
      for (int h = 0; h < 4; ++h)
        for (int i = 0; i < 64; ++i)
          for (int j = 0; j < 130; ++j) {
            const bool keep = dropout_keeps(rng, b, h, 4, i, j);
            kept += keep;
            ++n;
            kept_by_lane[j % 8] += keep;
            ++n_by_lane[j % 8];
          }
    auto check = [&](std::int64_t count, std::int64_t total, const char* what) {
      const double mean = total * q, sd = std::sqrt(total * q * (1.0 - q));
      EXPECT_LE(std::abs(count - mean), 6.0 * sd) << what << ": p = " << p << ", kept " << count << " of " << total;
    };
    check(kept, n, "all");
    for (int lane = 0; lane < 8; ++lane) check(kept_by_lane[lane], n_by_lane[lane], "key % 8");
  }
}

// ----- sinks and dropout against the oracle ------------------------------------

CaseSpec with_sinks(CaseSpec s) {
  s.sinks = true;
  return s;
}

CaseSpec with_dropout(CaseSpec s, float p, std::uint64_t seed = 2024, std::uint64_t offset = 7) {
  s.options.dropout_p = p;
  s.options.dropout_seed = seed;
  s.options.dropout_offset = offset;
  return s;
}

CaseSpec varlen_case(std::string label) {
  CaseSpec s;
  s.label = std::move(label);
  s.layout = CaseLayout::varlen;
  s.q_lens = {5, 0, 35, 7};
  s.kv_lens = {12, 3, 20, 0};  // the last sequence's rows see no key
  s.extra_rows = 3;
  s.heads_q = 4;
  s.heads_kv = 2;
  return s;
}

CaseSpec paged_case(std::string label) {
  CaseSpec s;
  s.label = std::move(label);
  s.layout = CaseLayout::kv_cache;
  s.cached_lens = {37, 0, 50};
  s.page_size = 16;
  s.q_len = 5;
  s.heads_q = 4;
  s.heads_kv = 2;
  return s;
}

// Cases for both passes: dense (with the score options), varlen, KV cache.
std::vector<CaseSpec> feature_cases() {
  std::vector<CaseSpec> cases;
  const CaseSpec dense = dense_case("", 33, 41, 4, 2, 64);
  cases.push_back(with_sinks(variant(dense, "sinks", [](CaseSpec&) {})));
  cases.push_back(with_sinks(variant(dense, "sinks_causal_q_longer", [](CaseSpec& s) {
    s.q_len = 40;
    s.kv_len = 17;  // rows that see no key: out = 0, lse = sink
    s.options.causal = true;
  })));
  cases.push_back(with_sinks(variant(dense, "sinks_softcap_alibi_window", [](CaseSpec& s) {
    s.options.softcap = 3.0f;
    s.alibi = AlibiKind::per_batch;
    s.options.window_left = 6;
    s.options.window_right = 2;
  })));
  cases.push_back(with_dropout(variant(dense, "dropout_0_3", [](CaseSpec&) {}), 0.3f));
  cases.push_back(with_dropout(variant(dense, "dropout_0_9_causal_gqa8", [](CaseSpec& s) {
    s.heads_q = 8;
    s.heads_kv = 1;
    s.options.causal = true;
  }), 0.9f, 1, 0xffffffffffffull));
  // Dropout over rows that see no key (out = 0, lse = -inf, whatever the mask), with a seed whose high word is
  // far from 0 and an offset whose 8 streams carry into the high word (the GPU suite has the same case).
  cases.push_back(with_dropout(variant(dense, "dropout_0_5_causal_q_longer_seed2p63", [](CaseSpec& s) {
    s.q_len = 40;
    s.kv_len = 17;
    s.options.causal = true;
  }), 0.5f, (std::uint64_t{1} << 63) - 3, (std::uint64_t{3} << 32) - 5));
  cases.push_back(with_sinks(with_dropout(variant(dense, "sinks_dropout_0_2_bhsd_softcap", [](CaseSpec& s) {
    s.bhsd = true;
    s.options.softcap = 2.0f;
  }), 0.2f)));
  cases.push_back(with_sinks(varlen_case("varlen_sinks_causal")));
  cases.back().options.causal = true;
  cases.push_back(with_sinks(with_dropout(varlen_case("varlen_sinks_dropout_0_25"), 0.25f)));
  cases.push_back(with_sinks(paged_case("paged_sinks_causal")));
  cases.back().options.causal = true;
  cases.push_back(with_sinks(with_dropout(paged_case("paged_sinks_dropout_0_4_shared_page"), 0.4f)));
  cases.back().share_first_page = true;
  return for_dtypes(cases, kAllDtypes);
}

class CpuSinksDropout : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuSinksDropout, ForwardMatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

TEST_P(CpuSinksDropout, BackwardMatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_backward(c, runner);
}

INSTANTIATE_TEST_SUITE_P(Features, CpuSinksDropout, ::testing::ValuesIn(feature_cases()), CaseSpecName());

// Calls that have no backward, causal with sinks and dropout 0.3, forward only.
void check_causal_forward_with_sinks_and_dropout(CaseSpec s) {
  CUFLASH_TEST_RNG(rng);
  s = with_sinks(with_dropout(std::move(s), 0.3f));
  s.options.causal = true;
  AttentionCase c(s, rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

// A KV-cache forward that appends: the new keys get a sink's share like any.
TEST(CpuSinksDropout, KvCacheAppendForward) {
  CaseSpec s = paged_case("append");
  s.new_len = 3;
  check_causal_forward_with_sinks_and_dropout(s);
}

// Varlen queries over keys in pages (as in flash-attn, no backward): the
// sinks and the dropout mask are those of the packed call, keys counted from
// each sequence's start.
TEST(CpuSinksDropout, PagedVarlenForward) {
  CaseSpec s = varlen_case("paged_varlen");
  s.page_size = 8;
  check_causal_forward_with_sinks_and_dropout(s);
}

// A row that sees no key gets out = 0 and lse = its sink; its gradients are 0.
TEST(CpuSinks, RowsWithoutKeysGetTheSink) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = with_sinks(dense_case("no_keys", 4, 2, 2, 1, 16, 1));
  s.options.causal = true;  // rows 0 and 1 see no key
  AttentionCase c(s, rng.engine());
  ASSERT_TRUE(attention_forward(c.forward_args(), c.options(Backend::cpu)).ok());
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 2; ++i) {
      // (Through base 2 and back: equal to float rounding.)
      EXPECT_FLOAT_EQ(c.lse.get(h * 4 + i), c.sinks.get(h)) << "h " << h << " row " << i;
      for (int d = 0; d < 16; ++d) EXPECT_EQ(c.out.get((i * 2 + h) * 16 + d), 0.0);
    }
}

// No key at all (kv_len = 0): the forward writes out = 0 and lse = sinks; the
// backward, which runs no kernel, writes dq = dk = dv = dsinks = 0.
TEST(CpuSinks, NoKeysAtAll) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = with_sinks(dense_case("kv0", 3, 0, 2, 1, 8, 2));
  AttentionCase c(s, rng.engine());
  ASSERT_TRUE(attention_forward(c.forward_args(), c.options(Backend::cpu)).ok());
  for (std::int64_t e = 0; e < c.lse.numel(); ++e) EXPECT_FLOAT_EQ(c.lse.get(e), c.sinks.get((e / 3) % 2));
  for (std::int64_t e = 0; e < c.out.numel(); ++e) EXPECT_EQ(c.out.get(e), 0.0);
  c.dsinks.poison();
  ASSERT_TRUE(attention_backward(c.backward_args(), c.options(Backend::cpu)).ok());
  for (std::int64_t e = 0; e < c.dsinks.numel(); ++e) EXPECT_EQ(c.dsinks.get(e), 0.0);
}

// ----- dsinks by finite differences of the oracle ------------------------------

// L(sinks) = sum(dout * out(sinks)) in float64; dL/dsinks[h] by central
// differences must match the oracle's analytic dsinks (which the backend is
// checked against above). With dropout the mask is fixed by the seed.
void expect_dsinks_match_finite_differences(CaseSpec s) {
  CUFLASH_TEST_RNG(rng);
  s.dtype = DType::f32;
  AttentionCase c(s, rng.engine());
  // Sinks are float32: sink +- step is exact only if the sink has no bits
  // below the step's reach, also where the sum crosses a power of two (a sink
  // of 0.99965 plus 2^-10 lost its last bit and moved the difference by 3e-5).
  // Snapping each sink to a multiple of 2^-12 keeps every perturbation exact.
  for (int h = 0; h < s.heads_q; ++h) c.sinks.set(h, std::ldexp(std::round(std::ldexp(c.sinks.get(h), 12)), -12));
  oracle::ForwardResult fwd;
  ASSERT_TRUE(oracle::forward_float64(c.forward_args(), s.options, &fwd).ok());
  c.set_forward_outputs(fwd.out, fwd.lse);
  oracle::BackwardResult ref;
  ASSERT_TRUE(oracle::backward_float64(c.backward_args(), s.options, &ref).ok());
  ASSERT_EQ(ref.dsinks.size(), static_cast<std::size_t>(s.heads_q));
  const std::vector<double> dout = c.dout.to_doubles();
  const std::vector<bool> owned = c.q_rows_owned();
  auto loss = [&](const HostTensor& sinks) {
    ForwardArgs args = c.forward_args();
    args.sinks = sinks.view();
    oracle::ForwardResult result;
    EXPECT_TRUE(oracle::forward_float64(args, s.options, &result).ok());
    double total = 0.0;
    for (std::size_t e = 0; e < result.out.size(); ++e)
      if (owned[e]) total += dout[e] * result.out[e];
    return total;
  };
  // The loss is smooth in the sinks. A central difference alone is off by
  // O(step^2), ~1e-6 at 2^-10; Richardson's combination of steps 2^-10 and
  // 2^-11 cancels that term, leaving O(step^4) against a bound of 1e-7.
  auto central_difference = [&](int h, double step) {
    HostTensor plus = c.sinks, minus = c.sinks;
    plus.set(h, c.sinks.get(h) + step);
    minus.set(h, c.sinks.get(h) - step);
    return (loss(plus) - loss(minus)) / (2 * step);
  };
  for (int h = 0; h < s.heads_q; ++h) {
    const double coarse = central_difference(h, 1.0 / 1024), fine = central_difference(h, 1.0 / 2048);
    const double numeric = (4 * fine - coarse) / 3;
    EXPECT_NEAR(ref.dsinks[h], numeric, 1e-7 * std::max(1.0, std::abs(numeric))) << "head " << h;
  }
}

TEST(OracleSinks, GradientMatchesFiniteDifferences) {
  CaseSpec s = with_sinks(dense_case("fd", 9, 13, 4, 2, 16, 2));
  s.options.causal = true;
  expect_dsinks_match_finite_differences(s);
}

TEST(OracleSinks, GradientMatchesFiniteDifferencesWithDropoutVarlen) {
  CaseSpec s = with_sinks(with_dropout(varlen_case("fd_varlen"), 0.3f));
  s.head_dim = 16;
  expect_dsinks_match_finite_differences(s);
}

// ----- dropout's mask: reproducible, and decoded from attn_probs ---------------

struct ProbsRun {
  HostTensor out, lse, probs;
};

// attn_probs' key extent: max_seqlen_k, or a KV cache's capacity.
std::int64_t probs_keys(const AttentionCase& c) {
  const CaseSpec& s = c.spec();
  if (s.layout != CaseLayout::kv_cache) {
    std::int64_t longest = 0;
    for (int b = 0; b < c.batch(); ++b) longest = std::max<std::int64_t>(longest, c.kv_len(b));
    return longest;
  }
  return s.page_size == 0 ? c.k.shape()[1] : static_cast<std::int64_t>(c.max_pages) * s.page_size;
}

ProbsRun run_with_probs(AttentionCase& c, const AttentionOptions& options) {
  const CaseSpec& s = c.spec();
  std::int64_t max_q = 0;
  for (int b = 0; b < c.batch(); ++b) max_q = std::max<std::int64_t>(max_q, c.q_len(b));
  HostTensor probs(DType::f32, {c.batch(), s.heads_q, max_q, probs_keys(c)});
  probs.poison();
  ForwardArgs args = c.forward_args();
  args.attn_probs = probs.view();
  const Status status = attention_forward(args, options);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return {c.out, c.lse, probs};
}

TEST(CpuDropout, SameSeedSameResultOtherOffsetOrSeedOther) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = with_dropout(dense_case("repro", 20, 24, 4, 2, 32, 2), 0.5f, 99, 1000);
  AttentionCase c(s, rng.engine());
  AttentionOptions options = c.options(Backend::cpu);
  const ProbsRun first = run_with_probs(c, options);
  const ProbsRun again = run_with_probs(c, options);
  EXPECT_TRUE(same_bytes(first.out, again.out));
  EXPECT_TRUE(same_bytes(first.probs, again.probs));
  EXPECT_TRUE(same_bytes(first.lse, again.lse));
  for (auto change : {+[](AttentionOptions& o) { o.dropout_offset += 1; },
                      +[](AttentionOptions& o) { o.dropout_seed += 1; }}) {
    AttentionOptions other = options;
    change(other);
    const ProbsRun changed = run_with_probs(c, other);
    EXPECT_FALSE(same_bytes(first.out, changed.out));
    EXPECT_TRUE(same_bytes(first.lse, changed.lse)) << "lse does not depend on dropout";
    std::int64_t differing = 0;
    for (std::int64_t e = 0; e < first.probs.numel(); ++e)
      differing += std::signbit(first.probs.get(e)) != std::signbit(changed.probs.get(e));
    // Independent masks at p = 0.5 disagree on about half the entries.
    EXPECT_GT(differing, first.probs.numel() / 3);
  }
}

// attn_probs against the oracle's, its signs against dropout_keeps, and each
// row's |p| plus the sink's share summing to 1.
void expect_probs_decode(CaseSpec s) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(s, rng.engine());
  const ProbsRun run = run_with_probs(c, c.options(Backend::cpu));
  ForwardArgs args = c.forward_args();
  args.attn_probs = run.probs.view();
  oracle::ForwardResult ref;
  ASSERT_TRUE(oracle::forward_float64(args, s.options, &ref).ok());
  const ErrorStats error = compare(run.probs, ref.attn_probs);
  EXPECT_EQ(error.mismatches, 0) << error.describe();
  EXPECT_LE(error.max_abs, 1e-5) << error.describe();

  const DropoutRng rng_params{s.options.dropout_seed, s.options.dropout_offset, dropout_threshold16(s.options.dropout_p)};
  const std::int64_t max_q = run.probs.shape()[2], max_k = run.probs.shape()[3];
  std::int64_t dropped = 0, entries = 0;
  for (int b = 0; b < c.batch(); ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (std::int64_t i = 0; i < max_q; ++i) {
        double row_sum = 0.0;
        for (std::int64_t j = 0; j < max_k; ++j) {
          const double value = run.probs.get(((b * s.heads_q + h) * max_q + i) * max_k + j);
          if (i >= c.q_len(b) || j >= c.kv_len(b)) {
            EXPECT_TRUE(value == 0.0 && !std::signbit(value)) << "outside the sequence: " << value;
            continue;
          }
          const bool kept = dropout_keeps(rng_params, b, h, s.heads_q, i, j);
          EXPECT_EQ(std::signbit(value), !kept) << "b " << b << " h " << h << " i " << i << " j " << j;
          dropped += !kept;
          ++entries;
          row_sum += std::abs(value);
        }
        if (i >= c.q_len(b)) continue;
        const std::int64_t lse_index = s.layout == CaseLayout::varlen ? -1 : (b * s.heads_q + h) * max_q + i;
        if (lse_index < 0) continue;
        const double lse = run.lse.get(lse_index);
        const double sink_share = s.sinks && std::isfinite(lse) ? std::exp(c.sinks.get(h) - lse) : 0.0;
        if (std::isfinite(lse)) EXPECT_NEAR(row_sum + sink_share, 1.0, 1e-5);
      }
  if (s.options.dropout_p > 0.0f) {
    const double p = s.options.dropout_p;
    EXPECT_LE(std::abs(dropped - entries * p), 6.0 * std::sqrt(entries * p * (1 - p)));
  } else {
    EXPECT_EQ(dropped, 0);
  }
}

TEST(CpuDropout, AttnProbsDecodeToTheMask) {
  CaseSpec s = with_dropout(dense_case("probs", 30, 45, 4, 2, 32, 2), 0.3f, 5, 11);
  s.options.causal = true;
  expect_probs_decode(s);
}

TEST(CpuDropout, AttnProbsWithoutDropoutAreTheProbabilities) {
  expect_probs_decode(with_sinks(dense_case("probs_plain", 17, 23, 2, 2, 16, 3)));
}

TEST(CpuDropout, AttnProbsVarlenKvCacheAndPagedVarlen) {
  CaseSpec varlen = with_sinks(with_dropout(varlen_case("probs_varlen"), 0.5f));
  expect_probs_decode(varlen);
  CaseSpec paged = with_dropout(paged_case("probs_paged"), 0.2f);
  paged.new_len = 2;
  expect_probs_decode(paged);
  CaseSpec paged_varlen = with_dropout(varlen_case("probs_paged_varlen"), 0.4f);
  paged_varlen.page_size = 16;
  expect_probs_decode(paged_varlen);
}

// ----- validation ----------------------------------------------------------------

TEST(SinksDropoutValidation, RejectsBadArguments) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(with_sinks(dense_case("bad", 4, 5, 2, 1, 8, 1)), rng.engine());
  auto forward_message = [&](const ForwardArgs& args, const AttentionOptions& options) {
    const Status status = attention_forward(args, options);
    EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
    return status.message();
  };
  const AttentionOptions options = c.options(Backend::cpu);
  for (float p : {1.0f, -0.1f, std::nanf(""), 2.0f}) {
    AttentionOptions bad = options;
    bad.dropout_p = p;
    EXPECT_NE(forward_message(c.forward_args(), bad).find("dropout_p"), std::string::npos);
  }
  HostTensor wrong_heads(DType::f32, {3});
  ForwardArgs args = c.forward_args();
  args.sinks = wrong_heads.view();
  EXPECT_NE(forward_message(args, options).find("sinks"), std::string::npos);
  HostTensor wrong_dtype(DType::f16, {2});
  args.sinks = wrong_dtype.view();
  EXPECT_NE(forward_message(args, options).find("float32"), std::string::npos);
  HostTensor wrong_probs(DType::f32, {1, 2, 4, 4});
  args = c.forward_args();
  args.attn_probs = wrong_probs.view();
  EXPECT_NE(forward_message(args, options).find("attn_probs"), std::string::npos);

  c.set_forward_outputs(std::vector<double>(c.out.numel(), 0.0), std::vector<double>(c.lse.numel(), 0.0));
  BackwardArgs backward = c.backward_args();
  backward.sinks = TensorView{};
  const Status status = attention_backward(backward, options);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument);
  EXPECT_NE(status.message().find("dsinks"), std::string::npos) << status.message();
  backward = c.backward_args();
  backward.dsinks = c.sinks.view();  // an output aliasing an input
  const Status aliased = attention_backward(backward, options);
  EXPECT_EQ(aliased.code(), StatusCode::invalid_argument) << aliased.to_string();
}

// The sinks' gradient is optional: a backward without dsinks still runs.
TEST(SinksDropoutValidation, DsinksOptional) {
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = with_sinks(dense_case("no_dsinks", 6, 7, 2, 1, 8, 1));
  AttentionCase c(s, rng.engine());
  oracle::ForwardResult fwd;
  ASSERT_TRUE(oracle::forward_float64(c.forward_args(), s.options, &fwd).ok());
  c.set_forward_outputs(fwd.out, fwd.lse);
  BackwardArgs backward = c.backward_args();
  backward.dsinks = TensorView{};
  const Status status = attention_backward(backward, c.options(Backend::cpu));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

}  // namespace
}  // namespace cuflash::test
