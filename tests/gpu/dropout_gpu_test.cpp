// backend=cuda with dropout (flash-attn's semantics, docs/semantics.md) against
// the float64 oracle, which draws the same Philox mask (src/core/philox.hpp):
// a kernel that draws another mask, scales by anything but 1/(1 - p), lets
// dropout touch lse, or ignores part of the 64-bit seed or offset is off by
// O(1), far beyond the tolerances. Every forward path is here once with
// dropout (sm80 over every tensor-core head dim, the long causal D128 shape
// that Hopper would give its wgmma/TMA kernels, split-KV, f32, varlen with
// empty sequences and rows of no key, score options, no caller lse, BHSD
// views, sinks), and the backward's dq, dk, dv (and dsinks) the same way,
// deterministic included. Then the mask itself, decoded from the debug
// probabilities' signs (attn_probs, S_dmask), bit for bit against backend cpu
// and dropout_keeps; its keep fraction; and that other seeds or offsets draw
// other masks. (The KV-cache layout refuses dropout: attention_unsupported_gpu_test.cpp.)
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpu/float64_oracle.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"
#include "philox.hpp"

namespace cuflash::test {
namespace {

using detail::dropout_keeps;
using detail::dropout_threshold16;
using detail::DropoutRng;

CaseSpec dropout(CaseSpec s, float p, std::uint64_t seed = 20240607, std::uint64_t offset = 3) {
  s.options.dropout_p = p;
  s.options.dropout_seed = seed;
  s.options.dropout_offset = offset;
  return s;
}

CaseSpec sinks(CaseSpec s) {
  s.sinks = true;
  return s;
}

// A seed whose high word is far from 0 (a kernel that keeps 32 bits of it
// draws another mask) and an offset whose streams offset .. offset + B*Hq - 1
// (3 * 4 = 12 here) carry into the high word: a kernel that adds b*Hq + h to
// the low word only, or drops the high word, draws another mask for some heads.
constexpr std::uint64_t kSeedNear2To63 = (std::uint64_t{1} << 63) - 3;
constexpr std::uint64_t kOffsetWrapping32 = (std::uint64_t{3} << 32) - 5;

CaseSpec wide_seed(CaseSpec s, float p) { return dropout(std::move(s), p, kSeedNear2To63, kOffsetWrapping32); }

// Softcap, a window on both sides and per-batch ALiBi slopes, without a
// caller lse (the kernels then keep theirs in scratch), in BHSD memory.
CaseSpec score_options_no_lse_bhsd(std::string label, float p) {
  CaseSpec s = dropout(dense_case(std::move(label), 45, 77, 4, 2, 64), p);
  s.options.softcap = 5.0f;
  s.options.window_left = 20;
  s.options.window_right = 3;
  s.alibi = AlibiKind::per_batch;
  s.with_lse = false;
  s.bhsd = true;
  return s;
}

// Lengths {5, 0, 35, 7} over {12, 3, 20, 0}: an empty sequence, one whose
// queries see no key, and packed rows after cu_seqlens[B] of no sequence.
CaseSpec varlen_empty(std::string label, int head_dim) {
  return causal(varlen_case(std::move(label), {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, head_dim));
}

std::vector<CaseSpec> forward_cases() {
  std::vector<CaseSpec> half = {
      dropout(causal(dense_case("dropout_causal_gqa", 65, 200, 4, 2, 64)), 0.1f),
      dropout(causal(dense_case("dropout_p05_causal_q_longer", 90, 40, 4, 2, 64)), 0.5f),  // rows with no key
      // On Hopper this shape goes to the wgmma/TMA kernels without dropout.
      dropout(causal(dense_case("dropout_long_causal_d128_k2048", 300, 2048, 4, 2, 128, 1)), 0.1f),
      dropout(dense_case("dropout_p05_splitkv_q1_k4097_d128", 1, 4097, 2, 1, 128, 1), 0.5f),
      dropout(varlen_empty("dropout_varlen_causal_empty", 64), 0.1f),
      score_options_no_lse_bhsd("dropout_p05_softcap_window_alibi_no_lse_bhsd", 0.5f),
      sinks(dropout(causal(dense_case("dropout_sinks_causal_gqa", 65, 130, 4, 2, 64)), 0.1f)),
      sinks(dropout(varlen_empty("dropout_p05_sinks_varlen", 64), 0.5f)),
      wide_seed(causal(dense_case("dropout_seed2p63_offset_wraps", 33, 70, 4, 2, 64, 3)), 0.5f),
  };
  for (int d : kTensorCoreHeadDims)
    half.push_back(dropout(dense_case("dropout_d" + std::to_string(d), 70, 150, 4, 2, d, 1), 0.1f));
  for (int d : {40, 80, 59})  // bounded columns, padded copies
    half.push_back(dropout(causal(dense_case("dropout_d" + std::to_string(d), 70, 150, 4, 2, d, 1)), 0.1f));
  std::vector<CaseSpec> f32 = {
      dropout(causal(dense_case("dropout_f32_causal_gqa", 33, 47, 4, 2, 64)), 0.1f),
      dropout(varlen_empty("dropout_p05_f32_varlen_d40", 40), 0.5f),
      dropout(dense_case("dropout_f32_d256", 20, 90, 2, 1, 256, 1), 0.1f),
      score_options_no_lse_bhsd("dropout_f32_softcap_window_alibi_no_lse_bhsd", 0.1f),
      sinks(wide_seed(causal(dense_case("dropout_f32_sinks_seed2p63_offset_wraps", 33, 70, 4, 2, 64, 3)), 0.5f)),
  };
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

std::vector<CaseSpec> backward_cases() {
  std::vector<CaseSpec> half = {
      dropout(causal(dense_case("dropout_causal_gqa", 65, 200, 4, 2, 64)), 0.1f),
      dropout(causal(dense_case("dropout_p05_causal_q_longer_d128", 90, 40, 4, 2, 128)), 0.5f),
      dropout(causal(dense_case("dropout_long_causal_d128_k2048", 256, 2048, 2, 1, 128, 1)), 0.1f),
      dropout(varlen_empty("dropout_varlen_causal_empty", 64), 0.1f),
      score_options_no_lse_bhsd("dropout_p05_softcap_window_alibi_bhsd", 0.5f),
      sinks(dropout(causal(dense_case("dropout_sinks_causal_gqa", 65, 130, 4, 2, 64)), 0.5f)),
      wide_seed(causal(dense_case("dropout_seed2p63_offset_wraps", 33, 70, 4, 2, 64, 3)), 0.1f),
  };
  for (int d : kTensorCoreHeadDims)
    half.push_back(dropout(dense_case("dropout_p05_d" + std::to_string(d), 70, 150, 4, 2, d, 1), 0.5f));
  for (int d : {40, 80, 59})
    half.push_back(dropout(causal(dense_case("dropout_p05_d" + std::to_string(d), 70, 150, 4, 2, d, 1)), 0.5f));
  std::vector<CaseSpec> f32 = {
      dropout(causal(dense_case("dropout_f32_causal_gqa", 33, 47, 4, 2, 64)), 0.1f),
      dropout(varlen_empty("dropout_p05_f32_varlen_d40", 40), 0.5f),
      sinks(wide_seed(dense_case("dropout_f32_sinks_seed2p63_offset_wraps", 33, 70, 4, 2, 96, 3), 0.5f)),
  };
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

// deterministic = true: a GQA group and several key blocks meet in one dq and
// one dk/dv element, and the mask must be redrawn identically by every pass.
std::vector<CaseSpec> deterministic_cases() {
  std::vector<CaseSpec> half = {
      dropout(causal(dense_case("det_dropout_gqa4_causal_d64", 300, 300, 4, 1, 64, 1)), 0.1f),
      dropout(dense_case("det_dropout_p05_gqa2_d128", 200, 260, 4, 2, 128, 1), 0.5f),
      sinks(dropout(varlen_empty("det_dropout_sinks_varlen", 64), 0.5f)),
  };
  return concat(for_gpu_dtypes(half, kHalfDtypes),
                for_gpu_dtypes({dropout(causal(dense_case("det_dropout_f32_gqa4_causal", 200, 200, 4, 1, 64, 1)),
                                        0.1f)},
                               kF32));
}

// The compute-sanitizer subset (scripts/gpu-check.sh runs names starting with
// "Sanitize"): each pass's dropout path once, small shapes.
std::vector<CaseSpec> sanitize_cases() {
  return concat(for_gpu_dtypes({dropout(causal(dense_case("dropout_causal_gqa", 65, 130, 4, 2, 64)), 0.5f),
                                dropout(varlen_empty("dropout_varlen", 64), 0.1f)},
                               {DType::bf16}),
                for_gpu_dtypes({dropout(causal(dense_case("dropout_f32_causal", 33, 47, 4, 2, 64)), 0.5f)}, kF32));
}

class CudaDropoutForward : public ::testing::TestWithParam<CaseSpec> {};
class CudaDropoutBackward : public ::testing::TestWithParam<CaseSpec> {};
class CudaDropoutDeterministic : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaDropoutForward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_forward_gpu(c, runner);
  expect_unowned_out_rows_untouched(c);
}

TEST_P(CudaDropoutBackward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_backward_gpu(c, runner);
}

TEST_P(CudaDropoutDeterministic, TwoRunsBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  check_deterministic_backward(GetParam(), Backend::cuda);
}

INSTANTIATE_TEST_SUITE_P(Dropout, CudaDropoutForward, ::testing::ValuesIn(forward_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Dropout, CudaDropoutBackward, ::testing::ValuesIn(backward_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Dropout, CudaDropoutDeterministic, ::testing::ValuesIn(deterministic_cases()),
                         CaseSpecName());
INSTANTIATE_TEST_SUITE_P(SanitizeDropout, CudaDropoutForward, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(SanitizeDropout, CudaDropoutBackward, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());

// backend auto: cudnn refuses dropout, so auto must end up on cuda and run it
// (not refuse the call, nor fall back to anything without the mask).
TEST(CudaDropoutAuto, RunsOnCuda) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_label(dtype));
    CaseSpec s = dropout(causal(dense_case("auto", 65, 130, 4, 2, 64)), 0.1f);
    s.dtype = dtype;
    AttentionCase c(s, rng.engine());
    DeviceRunner runner(Backend::automatic);
    check_forward_gpu(c, runner);
    check_backward_gpu(c, runner);
  }
}

// ----- the mask, decoded from attn_probs -------------------------------------------

// A host tensor's copy in device memory, for the views of one call.
class DeviceCopy {
 public:
  DeviceCopy(const HostTensor& host, bool poison) : host_(host) {
    ok_ = cudaMalloc(&data_, std::max<std::size_t>(host_.bytes().size(), 1)) == cudaSuccess;
    if (!ok_) return;
    ok_ = (poison ? cudaMemset(data_, 0xFF, host_.bytes().size())
                  : cudaMemcpy(data_, host_.bytes().data(), host_.bytes().size(), cudaMemcpyHostToDevice)) ==
          cudaSuccess;
  }
  ~DeviceCopy() { cudaFree(data_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  bool ok() const { return ok_; }
  TensorView view() const { return host_.empty() ? TensorView{} : host_.view_at(data_, Device::cuda(0)); }
  HostTensor back() {
    if (cudaMemcpy(host_.bytes().data(), data_, host_.bytes().size(), cudaMemcpyDeviceToHost) != cudaSuccess)
      ADD_FAILURE() << "test harness: copying back from the device failed";
    return host_;
  }

 private:
  HostTensor host_;
  void* data_ = nullptr;
  bool ok_ = false;
};

struct ProbsRun {
  Status status;
  HostTensor out, probs;  // probs: f32 [B, Hq, max_seqlen_q, max_kv]
};

std::int64_t longest(const AttentionCase& c, bool keys) {
  std::int64_t n = 0;
  for (int b = 0; b < c.batch(); ++b) n = std::max<std::int64_t>(n, keys ? c.kv_len(b) : c.q_len(b));
  return n;
}

// One forward of the case with attn_probs on `backend` under `options`:
// host views for cpu, device copies for cuda. Outputs start as NaN.
ProbsRun forward_with_probs(const AttentionCase& c, Backend backend, AttentionOptions options) {
  const CaseSpec& s = c.spec();
  // The probabilities' key extent: kv_len dense, max_seqlen_k varlen (the case's longest sequence).
  HostTensor probs(DType::f32, {c.batch(), s.heads_q, longest(c, false), longest(c, true)});
  HostTensor out = c.out, lse = c.lse;
  probs.poison();
  out.poison();
  if (!lse.empty()) lse.poison();
  const ForwardArgs host_args = c.forward_args();
  options.backend = backend;
  ProbsRun run;
  if (backend == Backend::cpu) {
    ForwardArgs args = host_args;
    args.out = out.view();
    args.lse = lse.view();
    args.attn_probs = probs.view();
    run.status = attention_forward(args, options);
    run.out = out;
    run.probs = probs;
    return run;
  }
  std::vector<std::unique_ptr<DeviceCopy>> copies;  // alive until the call has finished
  auto device = [&](const HostTensor& t, bool poison) {
    copies.push_back(std::make_unique<DeviceCopy>(t, poison));
    EXPECT_TRUE(copies.back()->ok()) << "test harness: cudaMalloc or the copy to the device failed";
    return copies.back()->view();
  };
  ForwardArgs args = host_args;
  args.q = device(c.q, false);
  args.k = device(c.k, false);
  args.v = device(c.v, false);
  args.alibi_slopes = device(c.alibi, false);
  args.sinks = device(c.sinks, false);
  if (s.layout == CaseLayout::varlen) {
    args.varlen.cu_seqlens_q = device(c.cu_seqlens_q, false);
    args.varlen.cu_seqlens_k = device(c.cu_seqlens_k, false);
  }
  args.lse = device(lse, true);
  args.out = device(out, true);
  DeviceCopy* out_copy = copies.back().get();
  args.attn_probs = device(probs, true);
  DeviceCopy* probs_copy = copies.back().get();
  run.status = attention_forward(args, options);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run.out = out_copy->back();
  run.probs = probs_copy->back();
  return run;
}

// What decoding attn_probs found over the entries (b, h, i, j) inside the
// sequences (i < q_len(b), j < kv_len(b)).
struct MaskDecode {
  std::int64_t visible = 0, visible_kept = 0;  // entries with p != 0 (the CPU's), and how many are kept
  std::int64_t sign_differs_cpu = 0;           // visible entries whose signs disagree between GPU and CPU
  std::int64_t sign_differs_philox = 0;        // ... between the GPU and dropout_keeps
  std::int64_t zero_sign_differs = 0;          // masked entries (p = 0): -0.0 must mark a drop there too
  std::int64_t zero_not_zero = 0;              // masked on the CPU, not 0 on the GPU
  std::int64_t outside_not_plus_zero = 0;      // outside the sequences: must be +0
  double worst_abs = 0.0;                      // max | |gpu| - |cpu| | over visible entries
  std::string first_difference;
};

MaskDecode decode(const AttentionCase& c, const HostTensor& gpu, const HostTensor& cpu, const AttentionOptions& o) {
  const CaseSpec& s = c.spec();
  const DropoutRng rng{o.dropout_seed, o.dropout_offset, dropout_threshold16(o.dropout_p)};
  const std::int64_t max_q = gpu.shape()[2], max_k = gpu.shape()[3];
  MaskDecode m;
  for (int b = 0; b < c.batch(); ++b)
    for (int h = 0; h < s.heads_q; ++h)
      for (std::int64_t i = 0; i < max_q; ++i)
        for (std::int64_t j = 0; j < max_k; ++j) {
          const std::int64_t e = ((static_cast<std::int64_t>(b) * s.heads_q + h) * max_q + i) * max_k + j;
          const double g = gpu.get(e), w = cpu.get(e);
          if (i >= c.q_len(b) || j >= c.kv_len(b)) {
            m.outside_not_plus_zero += !(g == 0.0 && !std::signbit(g));
            continue;
          }
          const bool gpu_dropped = std::signbit(g);
          const bool keeps = dropout_keeps(rng, b, h, s.heads_q, i, j);
          if (w == 0.0) {  // not visible (masked, or a row of no key)
            m.zero_not_zero += g != 0.0;
            m.zero_sign_differs += gpu_dropped == keeps;
            continue;
          }
          ++m.visible;
          m.visible_kept += !gpu_dropped;
          const bool differs = gpu_dropped != std::signbit(w) || gpu_dropped == keeps;
          m.sign_differs_cpu += gpu_dropped != std::signbit(w);
          m.sign_differs_philox += gpu_dropped == keeps;
          if (differs && m.first_difference.empty())
            m.first_difference = "b " + std::to_string(b) + " h " + std::to_string(h) + " i " + std::to_string(i) +
                                 " j " + std::to_string(j) + ": gpu " + std::to_string(g) + ", cpu " +
                                 std::to_string(w) + ", dropout_keeps " + (keeps ? "true" : "false");
          m.worst_abs = std::max(m.worst_abs, std::isfinite(g) ? std::abs(std::abs(g) - std::abs(w)) : INFINITY);
        }
  return m;
}

// Kept count within 6 standard deviations of n (1 - p): a false alarm about 1 in 10^9.
void expect_keep_fraction(std::int64_t kept, std::int64_t n, double p) {
  ASSERT_GT(n, 500) << "too few visible entries to test the keep fraction";
  const double mean = n * (1.0 - p), sd = std::sqrt(n * p * (1.0 - p));
  EXPECT_LE(std::abs(kept - mean), 6.0 * sd) << "kept " << kept << " of " << n << " at dropout_p " << p;
}

std::vector<CaseSpec> mask_cases() {
  std::vector<CaseSpec> all = {
      dropout(causal(dense_case("causal_gqa", 45, 70, 4, 2, 64)), 0.1f),
      dropout(causal(dense_case("p05_causal_q_longer", 70, 45, 4, 2, 64)), 0.5f),
      wide_seed(causal(dense_case("p05_seed2p63_offset_wraps", 33, 70, 4, 2, 64, 3)), 0.5f),
      sinks(dropout(varlen_empty("sinks_varlen_causal_empty", 64), 0.5f)),
      dropout(dense_case("p05_d128_k300", 40, 300, 4, 2, 128, 2), 0.5f),
  };
  all.back().options.window_left = 50;
  all.back().options.softcap = 4.0f;
  all.back().alibi = AlibiKind::per_head;
  all.back().with_lse = false;
  return for_gpu_dtypes(all, {DType::bf16, DType::f16, DType::f32});
}

class CudaDropoutMask : public ::testing::TestWithParam<CaseSpec> {};

// The mask of every visible entry, from the sign of attn_probs, equals backend
// cpu's and dropout_keeps' bit for bit; the magnitudes are cpu's |p| within the
// attn_probs suite's tolerance; out is the oracle's; the keep fraction is 1 - p.
TEST_P(CudaDropoutMask, EqualsCpuAndPhiloxBitForBit) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  const AttentionOptions options = c.spec().options;
  const ProbsRun cpu = forward_with_probs(c, Backend::cpu, options);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status.to_string();
  const ProbsRun gpu = forward_with_probs(c, Backend::cuda, options);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.to_string();
  const MaskDecode m = decode(c, gpu.probs, cpu.probs, options);
  EXPECT_EQ(m.sign_differs_cpu, 0) << "visible entries dropped differently than on cpu; first: " << m.first_difference;
  EXPECT_EQ(m.sign_differs_philox, 0) << "visible entries dropped unlike dropout_keeps; first: " << m.first_difference;
  EXPECT_EQ(m.zero_not_zero, 0) << "entries that are 0 on cpu (not visible) are not 0 on the GPU";
  EXPECT_EQ(m.outside_not_plus_zero, 0) << "entries outside the sequences must be +0";
  const DType dtype = c.spec().dtype;
  EXPECT_LE(m.worst_abs, dtype == DType::f32 ? 2e-5 : (dtype == DType::f16 ? 4e-3 : 2.5e-2));
  expect_keep_fraction(m.visible_kept, m.visible, options.dropout_p);

  ForwardArgs args = c.forward_args();
  oracle::ForwardResult ref;
  ASSERT_TRUE(oracle::forward_float64(args, options, &ref).ok());
  const ErrorStats out = compare(gpu.out, ref.out);
  EXPECT_LE(out.rel_l2, default_tolerance(dtype).out_rel_l2) << "out with attn_probs: " << out.describe();
  EXPECT_EQ(out.mismatches, 0) << out.describe();
}

// docs/semantics.md: the sign bit marks a drop in every entry of the sequence,
// also where p is 0 (not visible): -0.0 there, as backend cpu writes.
TEST_P(CudaDropoutMask, MaskedEntriesAreSignedZeros) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  const AttentionOptions options = c.spec().options;
  const ProbsRun cpu = forward_with_probs(c, Backend::cpu, options);
  ASSERT_TRUE(cpu.status.ok()) << cpu.status.to_string();
  const ProbsRun gpu = forward_with_probs(c, Backend::cuda, options);
  ASSERT_TRUE(gpu.status.ok()) << gpu.status.to_string();
  const MaskDecode on_gpu = decode(c, gpu.probs, cpu.probs, options);
  const MaskDecode on_cpu = decode(c, cpu.probs, cpu.probs, options);
  ASSERT_EQ(on_cpu.zero_sign_differs, 0) << "backend cpu itself does not sign its zeros";
  EXPECT_EQ(on_gpu.zero_sign_differs, 0) << "entries of p = 0 whose sign bit disagrees with dropout_keeps";
}

INSTANTIATE_TEST_SUITE_P(Dropout, CudaDropoutMask, ::testing::ValuesIn(mask_cases()), CaseSpecName());

// The same seed and offset draw the same mask and out (bit for bit); another
// seed, or the next call's offset (advanced by B * Hq), draws an independent
// mask: the two disagree on about 2 p (1 - p) of the visible entries.
TEST(CudaDropoutMask, OtherSeedOrOffsetOtherMask) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (float p : {0.1f, 0.5f}) {
    SCOPED_TRACE("dropout_p " + std::to_string(p));
    CaseSpec s = dropout(causal(dense_case("reseed", 45, 70, 4, 2, 64, 2)), p, 99, 1000);
    s.dtype = DType::bf16;
    AttentionCase c(s, rng.engine());
    const AttentionOptions options = s.options;
    const ProbsRun first = forward_with_probs(c, Backend::cuda, options);
    ASSERT_TRUE(first.status.ok()) << first.status.to_string();
    const ProbsRun again = forward_with_probs(c, Backend::cuda, options);
    ASSERT_TRUE(again.status.ok()) << again.status.to_string();
    EXPECT_TRUE(same_bytes(first.probs, again.probs)) << "the same seed and offset gave other attn_probs";
    EXPECT_TRUE(same_bytes(first.out, again.out)) << "the same seed and offset gave another out";

    AttentionOptions other_seed = options, next_offset = options;
    other_seed.dropout_seed += 1;
    next_offset.dropout_offset += static_cast<std::uint64_t>(c.batch()) * s.heads_q;
    for (const AttentionOptions& changed_options : {other_seed, next_offset}) {
      const ProbsRun changed = forward_with_probs(c, Backend::cuda, changed_options);
      ASSERT_TRUE(changed.status.ok()) << changed.status.to_string();
      // Its own mask is right (against dropout_keeps under its options)...
      const MaskDecode m = decode(c, changed.probs, changed.probs, changed_options);
      EXPECT_EQ(m.sign_differs_philox, 0) << m.first_difference;
      // ...and differs from the first one's as independent draws do.
      std::int64_t visible = 0, differing = 0;
      for (std::int64_t e = 0; e < first.probs.numel(); ++e) {
        if (first.probs.get(e) == 0.0) continue;
        ++visible;
        differing += std::signbit(first.probs.get(e)) != std::signbit(changed.probs.get(e));
      }
      const double expected = visible * 2.0 * p * (1.0 - p);
      EXPECT_GT(differing, expected / 2) << differing << " of " << visible << " visible entries differ";
      EXPECT_FALSE(same_bytes(first.out, changed.out));
    }
  }
}

}  // namespace
}  // namespace cuflash::test
