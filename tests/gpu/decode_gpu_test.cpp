// backend=cuda KV-cache forward (the decode kernel: decode, speculative
// decode and chunked prefill against contiguous and paged caches, with the
// append) against the float64 oracle: the shared KV-cache lists
// (kv_cache_cases, gpu_kv_cache_cases, decode_cases) in f16 and bf16, where
// check_forward also checks that the append wrote exactly its slots and left
// every other cache row (NaN-poisoned slack, guard pages) bit-identical. Then
// what the lists cannot say: paged and contiguous caches give the same bits,
// guard pages and slack filled with a finite sentinel stay so, bad indices
// are refused with nothing written (or, unchecked, stay in bounds), and the
// workspace is sized by the capacity so that one query serves a decode loop.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "cudnn_cases.hpp"
#include "common/decode_cases.hpp"
#include "common/kv_cache_checks.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

// Empty when backend=cuda must run the KV-cache case; else what its refusal says.
std::vector<std::string> cuda_kv_refusal(const CaseSpec& s) {
  if (s.dtype == DType::f32) return {"backend cuda", "f32"};
  if (s.head_dim > 256) return {"backend cuda", "head_dim " + std::to_string(s.head_dim)};
  if (s.page_size > 0 && !cuda_takes_page_size(s.page_size)) return {"backend cuda", kPageSizeRefusal};
  return {};
}

void check_cuda_kv_case(const CaseSpec& spec) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(spec, rng.engine());
  DeviceRunner runner;
  const std::vector<std::string> refusal = cuda_kv_refusal(spec);
  if (!refusal.empty()) {
    expect_refused(c, runner, TestPass::forward, refusal);
    return;
  }
  check_forward_gpu(c, runner);
}

class CudaDecode : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaDecode, MatchesOracleOrRefused) {
  SKIP_WITHOUT_GPU();
  check_cuda_kv_case(GetParam());
}

std::vector<CaseSpec> shared_kv_cases() {
  return for_gpu_dtypes(concat(kv_cache_cases(), gpu_kv_cache_cases()), kHalfDtypes);
}

INSTANTIATE_TEST_SUITE_P(KvCache, CudaDecode, ::testing::ValuesIn(shared_kv_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Decode, CudaDecode, ::testing::ValuesIn(for_gpu_dtypes(decode_cases(), kHalfDtypes)),
                         CaseSpecName());

// CUFLASH_DECODE_CTA for one scope: the kernel's CTA shape, which its rule
// picks by grid size (the wide CTA only for grids that fill the GPU), forced
// so that small cases run either shape.
class ScopedDecodeCta {
 public:
  explicit ScopedDecodeCta(const char* shape) {
    const char* old = std::getenv(kName);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(kName, shape, 1);
  }
  ~ScopedDecodeCta() {
    if (had_) setenv(kName, old_.c_str(), 1);
    else unsetenv(kName);
  }

 private:
  static constexpr const char* kName = "CUFLASH_DECODE_CTA";
  bool had_ = false;
  std::string old_;
};

// The wide CTA on every decode case it can take (rows of one m16 tile, its
// heads dividing the kv heads; the others run the per-head CTA, as the
// knob only applies where the wide one can run).
class CudaDecodeWide : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaDecodeWide, MatchesOracleOrRefused) {
  SKIP_WITHOUT_GPU();
  ScopedDecodeCta wide("wide");
  check_cuda_kv_case(GetParam());
}

std::vector<CaseSpec> wide_decode_cases() {
  std::vector<CaseSpec> cases;
  for (CaseSpec& s : decode_cases())
    if (s.label.rfind("wide_", 0) == 0) cases.push_back(std::move(s));
  return for_gpu_dtypes(cases, kHalfDtypes);
}

INSTANTIATE_TEST_SUITE_P(Decode, CudaDecodeWide, ::testing::ValuesIn(wide_decode_cases()), CaseSpecName());

// The compute-sanitizer subset: the decode kernel in each of its shapes
// (one and two m-tiles, split and unsplit, plain and transformed scores, the
// loader's page-at-a-time paths from one page per tile to one per row, its
// row-by-row path of head dim 96, the wide CTA), the append, the combine, a
// leftpad and a rotary embedding; small caches.
CaseSpec in_dtype(CaseSpec s, DType dtype) {
  s.dtype = dtype;
  return s;
}

std::vector<CaseSpec> sanitize_cases() {
  CaseSpec options = decode_case("decode_paged64_split_window_softcap_alibi", 64, 1, 1, {2000}, 8, 2, 128);
  options.options.window_left = 700;
  options.options.softcap = 3.0f;
  options.alibi = AlibiKind::per_batch;
  CaseSpec unchecked = decode_case("decode_paged16_d256_unchecked", 16, 2, 1, {40, 0, 17}, 4, 2, 256);
  unchecked.options.check_index_contents = false;
  // A leftpad and the rotated Q load and append (GPT-NeoX with whole chunks
  // and with 20 columns, GPT-J on a head dim loaded row by row), a leftpad
  // split over several CTAs, eight kv heads (wide where the GPU's size picks it).
  CaseSpec neox = decode_case("decode_leftpad_rotary_neox_spec4", 0, 4, 4, {40, 0, 70}, 8, 2, 128);
  neox.leftpad = {17, 0, 64};
  neox.rotary_dim = 64;
  CaseSpec neox20 = decode_case("decode_rotary_neox20_d64", 16, 1, 1, {40, 0, 17}, 4, 2, 64);
  neox20.rotary_dim = 20;
  CaseSpec interleaved = decode_case("decode_rotary_interleaved_d96_paged1", 1, 2, 2, {30, 0}, 4, 2, 96);
  interleaved.rotary_dim = 96;
  interleaved.rotary_interleaved = true;
  CaseSpec leftpad_split = decode_case("decode_leftpad_split", 0, 1, 1, {2000}, 8, 2, 128);
  leftpad_split.leftpad = {700};
  CaseSpec hk8 = decode_case("decode_hk8_leftpad_rotary", 0, 1, 1, {40, 3, 17}, 16, 8, 128);
  hk8.leftpad = {9, 3, 0};
  hk8.rotary_dim = 128;
  CaseSpec paged_leftpad = decode_case("decode_paged16_leftpad_split_rotary", 16, 2, 2, {1500, 40, 17}, 8, 2, 128);
  paged_leftpad.leftpad = {700, 17, 16};
  paged_leftpad.rotary_dim = 64;
  return {in_dtype(decode_case("decode_paged16_gqa4_append1", 16, 1, 1, {37, 0, 70}, 8, 2, 128), DType::bf16),
          in_dtype(decode_case("decode_contiguous_spec8_append8_rows32", 0, 8, 8, {37, 0, 70}, 8, 2, 64), DType::f16),
          in_dtype(options, DType::bf16),
          in_dtype(decode_case("decode_paged1_d96_chunk20_append20", 1, 20, 20, {30, 0}, 4, 2, 96), DType::f16),
          in_dtype(decode_case("decode_paged8_d128_row_per_page", 8, 1, 1, {37, 0, 140}, 8, 2, 128), DType::f16),
          in_dtype(unchecked, DType::bf16),
          in_dtype(decode_case("decode_paged16_d80_split_append2", 16, 2, 2, {1500, 0, 33}, 4, 2, 80), DType::bf16),
          in_dtype(decode_case("decode_contiguous_d59_append1", 0, 1, 1, {37, 0, 70}, 4, 2, 59), DType::f16),
          in_dtype(neox, DType::bf16),
          in_dtype(neox20, DType::f16),
          in_dtype(interleaved, DType::bf16),
          in_dtype(leftpad_split, DType::f16),
          in_dtype(hk8, DType::bf16),
          in_dtype(paged_leftpad, DType::f16)};
}

// Head dims between the kernels' (bounded columns) and not multiples of 8 (padded
// copies of the whole cache, written back after an append), paged and contiguous.
std::vector<CaseSpec> head_dim_decode_cases() {
  std::vector<CaseSpec> cases;
  for (const std::vector<int>* dims : {&kNarrowHeadDims, &kPaddedHeadDims})
    for (int d : *dims) {
      const std::string l = "_d" + std::to_string(d);
      cases.push_back(decode_case("decode_paged16" + l + "_append1", 16, 1, 1, {37, 0, 300}, 8, 2, d));
      cases.push_back(decode_case("decode_contiguous" + l + "_q4_split", 0, 4, 0, {2000, 5}, 4, 2, d));
      // A leftpad and a rotary embedding over the caller's columns (rotary_dim
      // even and at most d): the bounded Q load and the padded copy rotate
      // only those.
      CaseSpec options = decode_case("decode_contiguous" + l + "_leftpad_rotary", 0, 2, 2, {37, 0, 300}, 4, 2, d);
      options.leftpad = {5, 0, 260};
      options.rotary_dim = d - d % 2;
      if (options.rotary_dim > 0) cases.push_back(options);
    }
  return for_gpu_dtypes(cases, kHalfDtypes);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaDecode, ::testing::ValuesIn(head_dim_decode_cases()), CaseSpecName());

INSTANTIATE_TEST_SUITE_P(Sanitize, CudaDecode, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());

// ... and the wide CTA: split with a page per tile, row by row (page 1),
// D=256 with unchecked indices.
std::vector<CaseSpec> sanitize_wide_cases() {
  CaseSpec unchecked = decode_case("decode_wide_paged16_d256_unchecked", 16, 1, 1, {40, 0, 17}, 8, 4, 256);
  unchecked.options.check_index_contents = false;
  return {in_dtype(decode_case("decode_wide_paged16_split", 16, 1, 1, {1500, 0, 33}, 32, 8, 128), DType::bf16),
          in_dtype(decode_case("decode_wide_paged1_d64", 1, 2, 1, {40, 0, 17}, 16, 8, 64), DType::f16),
          in_dtype(unchecked, DType::bf16)};
}

INSTANTIATE_TEST_SUITE_P(SanitizeWide, CudaDecodeWide, ::testing::ValuesIn(sanitize_wide_cases()), CaseSpecName());

// ----- paged and contiguous: the same bits ------------------------------------------------

struct LayoutCase {
  std::string label;
  DType dtype;
  int page_size;
  int q_len, new_len;
  std::vector<int> cached;
  int heads_q = 8, heads_kv = 2;
  const char* cta = nullptr;  // CUFLASH_DECODE_CTA for both calls, if set
};

void PrintTo(const LayoutCase& c, std::ostream* os) { *os << c.label; }

class CudaDecodePagedVsContiguous : public ::testing::TestWithParam<LayoutCase> {};

// Tiles sit at multiples of 64 keys (16 for the wide CTA) whatever the page
// size, and the CTA shape and split count depend on shapes and lengths, not
// on the layout: the two calls must agree bit for bit.
TEST_P(CudaDecodePagedVsContiguous, SameBits) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const LayoutCase& l = GetParam();
  std::optional<ScopedDecodeCta> cta;
  if (l.cta != nullptr) cta.emplace(l.cta);
  CaseSpec contiguous_spec = decode_case(l.label + "_contiguous", 0, l.q_len, l.new_len, l.cached, l.heads_q, l.heads_kv, 128);
  contiguous_spec.dtype = l.dtype;
  contiguous_spec.alibi = AlibiKind::per_head;
  CaseSpec paged_spec = contiguous_spec;
  paged_spec.label = l.label + "_paged";
  paged_spec.page_size = l.page_size;
  AttentionCase contiguous(contiguous_spec, rng.engine());
  AttentionCase paged(paged_spec, rng.engine());
  copy_logical_contents(contiguous, paged);
  DeviceRunner runner;
  {
    SCOPED_TRACE("contiguous");
    check_forward_gpu(contiguous, runner);
  }
  {
    SCOPED_TRACE("paged");
    check_forward_gpu(paged, runner);
  }
  EXPECT_EQ(count_output_differences(contiguous, paged), 0)
      << "elements of out/lse that differ between the paged and the contiguous cache";
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CudaDecodePagedVsContiguous,
    ::testing::Values(LayoutCase{"page16_decode_append1", DType::bf16, 16, 1, 1, {300, 0, 1000, 64}},
                      LayoutCase{"page64_spec4_append4", DType::f16, 64, 4, 4, {300, 0, 1000, 63}},
                      LayoutCase{"page256_long_split", DType::bf16, 256, 1, 1, {5000}},
                      LayoutCase{"page32_chunk40", DType::f16, 32, 40, 40, {100, 7}},
                      LayoutCase{"wide_page16_decode", DType::bf16, 16, 1, 1, {300, 0, 1000, 64}, 32, 8, "wide"},
                      LayoutCase{"wide_page64_long_split", DType::f16, 64, 1, 1, {5000}, 32, 8, "wide"}),
    [](const ::testing::TestParamInfo<LayoutCase>& info) { return info.param.label; });

// ----- the append writes exactly its slots ------------------------------------------------

// Cache rows no sequence owns (guard pages, the slots past each sequence's
// append) hold a finite sentinel rather than NaN, so that a stray write of
// any value shows; cached rows are random, append targets are checked by
// check_forward. The sentinel must come back exactly.
void check_sentinel_rows(CaseSpec spec) {
  CUFLASH_TEST_RNG(rng);
  spec.poison_unused = false;
  AttentionCase c(spec, rng.engine());
  constexpr double kSentinel = -3.0;  // exact in f16 and bf16
  const std::int64_t rows = fill_unowned_cache_rows(c, kSentinel);
  ASSERT_GT(rows, 0) << "the case has no guard rows";
  DeviceRunner runner;
  check_forward_gpu(c, runner);
  EXPECT_EQ(count_unowned_cache_changes(c, kSentinel), 0) << "sentinel elements of k/v changed, over " << rows
                                                          << " guard rows";
}

TEST(CudaDecodeAppend, GuardPagesKeepTheirSentinel) {
  SKIP_WITHOUT_GPU();
  CaseSpec s = decode_case("paged16_append40_guards", 16, 5, 40, {10, 0, 33, 16}, 8, 2, 128);
  s.guard_pages = 5;
  s.dtype = DType::bf16;
  check_sentinel_rows(s);
}

TEST(CudaDecodeAppend, ContiguousSlackKeepsItsSentinel) {
  SKIP_WITHOUT_GPU();
  CaseSpec s = decode_case("contiguous_append3_slack", 0, 1, 3, {10, 0, 33, 16}, 8, 2, 64);
  s.capacity_slack = 9;
  s.dtype = DType::f16;
  check_sentinel_rows(s);
}

// ----- bad indices ---------------------------------------------------------------------------

// A valid paged case whose index tensors (in GPU memory, copied to the host by
// validation) are then broken: invalid_argument naming the argument, nothing written.
void expect_invalid_indices(const std::string& label, void (*breaker)(AttentionCase&),
                            const std::string& must_mention) {
  SCOPED_TRACE(label);
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = decode_case(label, 16, 1, 3, {20, 50}, 8, 2, 128);
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  breaker(c);
  const AttentionCase before = c;
  DeviceRunner runner;
  const Status status = runner.forward(c, c.options(Backend::cuda));
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find(must_mention), std::string::npos) << status.message();
  expect_case_unchanged(before, c);
}

TEST(CudaDecodeBadInput, RefusedWithNothingWritten) {
  SKIP_WITHOUT_GPU();
  // Sequence 1 holds 50 + 3 keys: pages 0..3 of its row are read.
  expect_invalid_indices("block_table_entry_past_the_cache",
                         [](AttentionCase& c) { c.block_table.set(c.max_pages + 3, c.k.shape()[0] + 2); },
                         "kv_cache.block_table: block_table[1][3]");
  expect_invalid_indices("cache_length_beyond_capacity",
                         [](AttentionCase& c) { c.seqlens_k.set(1, c.max_pages * 16 + 1); },
                         "kv_cache.seqlens_k: seqlens_k[1]");
  expect_invalid_indices("append_overflows_the_cache",
                         [](AttentionCase& c) { c.seqlens_k.set(0, c.max_pages * 16 - 2); },
                         "kv_cache.k_new: appending 3 keys to sequence 0");
  // Sequence 1's page 3 (its keys 48..63, append at slots 2..4) becomes
  // sequence 0's page 1 (its keys 16..31, append at slots 4..6).
  expect_invalid_indices("two_appends_into_one_slot",
                         [](AttentionCase& c) { c.block_table.set(c.max_pages + 3, c.block_table.get(1)); },
                         "both append into page");
}

// With check_index_contents off nothing reads the indices on the host; bad
// ones give wrong results but no access outside the tensors (the runner's
// guard bytes, and compute-sanitizer under gpu-check.sh, would show one).
TEST(SanitizeCudaDecodeUnchecked, BadIndicesStayInBounds) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = decode_case("unchecked_bad_indices", 16, 2, 3, {20, 50}, 8, 2, 128);
  s.dtype = DType::bf16;
  s.options.check_index_contents = false;
  AttentionCase c(s, rng.engine());
  c.block_table.set(1, -7);                       // a negative page
  c.block_table.set(c.max_pages + 3, 1 << 20);    // a page far past the cache
  c.seqlens_k.set(0, 1 << 30);                    // a length far past the capacity
  DeviceRunner runner;
  const Status status = runner.forward(c, c.options(Backend::cuda));
  EXPECT_TRUE(status.ok()) << status.to_string();
}

// ----- workspace ---------------------------------------------------------------------------

// Sized by the cache's capacity, not this call's lengths: a decode loop can
// query once while its caches grow.
TEST(CudaDecodeWorkspace, SizedByCapacityNotLengths) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  std::size_t bytes[2] = {0, 0};
  const int cached[2] = {4000, 10};
  for (int n = 0; n < 2; ++n) {
    CaseSpec s = decode_case("workspace_" + std::to_string(cached[n]), 0, 1, 1, {cached[n]}, 8, 2, 128);
    s.capacity_slack = 4100 - cached[n];  // the same capacity: 4101 keys
    s.dtype = DType::bf16;
    AttentionCase c(s, rng.engine());
    DeviceRunner runner;
    check_forward_gpu(c, runner);
    ASSERT_TRUE(runner.last_workspace_status.ok()) << runner.last_workspace_status.to_string();
    bytes[n] = runner.last_workspace_bytes;
  }
  EXPECT_GT(bytes[0], 0u) << "one sequence of 8 heads over 4000 keys should split";
  EXPECT_EQ(bytes[0], bytes[1]);
}

TEST(CudaDecodeWorkspace, NoneGivenAndTooSmall) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = decode_case("workspace_modes", 16, 1, 1, {3000}, 8, 2, 128);
  s.dtype = DType::f16;
  {
    AttentionCase c(s, rng.engine());
    DeviceRunner runner;
    runner.workspace_mode = WorkspaceMode::none;
    check_forward_gpu(c, runner);
  }
  AttentionCase c(s, rng.engine());
  DeviceRunner runner;
  runner.workspace_mode = WorkspaceMode::too_small;
  const AttentionCase before = c;
  const Status status = runner.forward(c, c.options(Backend::cuda));
  ASSERT_GT(runner.last_workspace_bytes, 0u);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  expect_case_unchanged(before, c);  // the append did not run either
}

// ----- auto -------------------------------------------------------------------------------------

// An append: cudnn refuses it (cudnn_support.cpp), so auto must run it on cuda.
TEST(CudaDecodeAuto, AppendRunsOnCuda) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = decode_case("auto_append", 16, 1, 1, {300, 0, 77}, 8, 2, 128);
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(Backend::automatic);
  check_forward_gpu(c, runner);
}

}  // namespace
}  // namespace cuflash::test
