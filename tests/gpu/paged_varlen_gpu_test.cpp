// backend=cuda on varlen forwards whose keys are in a paged cache
// (kv_cache.block_table with cu_seqlens: flash-attn's paged prefill), which
// packs the keys into the workspace and runs the varlen kernels on them
// (src/cuda/common/paged_varlen.hpp). Against the float64 oracle: page sizes
// 16 to 256 around the kernels' 64- and 128-key tiles, sequences of 0 to 1000
// keys, causal with fewer queries than keys, GQA, window, softcap, ALiBi,
// sinks, dropout, strided and padded caches, a page shared by every
// sequence, f32; pages shuffled, guard pages and the slots after each
// sequence's keys NaN. Then: the same bits as the call with the keys packed,
// the same bits without index checks (the workspace then sized by the bound
// batch x max_seqlen_k), bad block tables refused with nothing written or,
// unchecked, kept inside the tensors; page sizes that are neither a power of
// two nor a multiple of 64 (192 runs) and backend cudnn refused by name;
// auto runs it on cuda.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cudnn_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

CaseSpec in_pages(CaseSpec s, int page_size) {
  s.page_size = page_size;
  s.label += "_page" + std::to_string(page_size);
  return s;
}

// Lengths around the tiles (64 and 128 keys), a sequence without queries and
// one without keys; the second has fewer queries than keys (causal aligned
// bottom-right).
const std::vector<int> kQLens = {1, 100, 0, 37, 300};
const std::vector<int> kKLens = {700, 100, 45, 0, 1000};

std::vector<CaseSpec> forward_cases() {
  std::vector<CaseSpec> half;
  const CaseSpec gqa = causal(varlen_case("gqa4_causal_d128", kQLens, kKLens, 8, 2, 128));
  for (int page_size : {16, 64, 128, 256}) half.push_back(in_pages(gqa, page_size));
  half.push_back(in_pages(varlen_case("mqa_d64", kQLens, kKLens, 4, 1, 64), 32));
  CaseSpec s = varlen_case("window_100_0_d64", {64, 3, 129}, {64, 500, 129}, 4, 4, 64);
  s.options.window_left = 100;
  s.options.window_right = 0;
  half.push_back(in_pages(s, 64));
  s = varlen_case("softcap_alibi_d96", {17, 200}, {300, 200}, 4, 2, 96);
  s.options.softcap = 4.0f;
  s.alibi = AlibiKind::per_batch;
  half.push_back(in_pages(s, 128));
  s = causal(varlen_case("sinks_dropout_0_2_d64", {40, 0, 90}, {90, 10, 90}, 4, 2, 64));
  s.sinks = true;
  s.options.dropout_p = 0.2f;
  s.options.dropout_seed = 7;
  half.push_back(in_pages(s, 16));
  s = causal(varlen_case("shared_first_page_d256_no_lse", {5, 70, 64}, {300, 270, 64}, 2, 1, 256));
  s.share_first_page = true;  // a common prefix: every sequence's first page is sequence 0's
  s.with_lse = false;
  half.push_back(in_pages(s, 64));
  s = varlen_case("bhsd_padded_d64", {33, 1}, {129, 700}, 4, 2, 64);
  s.bhsd = true;          // cache memory [num_pages, Hk, page_size, D]
  s.row_padding = 8;      // 8 unused elements after each row
  half.push_back(in_pages(s, 64));
  // A multiple of 64 that is no power of two (flash-attn's pages are multiples
  // of 256); neither: refused by backend cuda (the CPU suite runs page 48).
  half.push_back(in_pages(causal(varlen_case("gqa_causal_page192", {5, 300}, {190, 700}, 4, 2, 64)), 192));
  half.push_back(in_pages(causal(varlen_case("gqa_causal", {5, 40}, {50, 40}, 4, 2, 64)), 48));
  const std::vector<CaseSpec> f32 = {
      in_pages(causal(varlen_case("f32_gqa_causal_d40", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 40)), 16),
      in_pages(varlen_case("f32_d64", {1, 70}, {300, 70}, 2, 1, 64), 128),
  };
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

void check_paged_varlen_case(const CaseSpec& spec) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(spec, rng.engine());
  DeviceRunner runner;
  if (!cuda_takes_page_size(spec.page_size)) {
    expect_refused(c, runner, TestPass::forward, {"backend cuda", "page_size", kPageSizeRefusal});
    return;
  }
  check_forward_gpu(c, runner);
  expect_unowned_out_rows_untouched(c);
}

class CudaPagedVarlen : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaPagedVarlen, MatchesOracleOrRefused) {
  SKIP_WITHOUT_GPU();
  check_paged_varlen_case(GetParam());
}

// out and lse of the paged call, against those of the call with the keys
// packed (the same kernels on the same keys); index checks on or off.
void expect_same_bits_as_packed(const CaseSpec& spec, bool check_index_contents) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase paged(spec, rng.engine());
  AttentionCase packed = paged.with_packed_keys();
  AttentionOptions options = paged.options(Backend::cuda);
  options.check_index_contents = check_index_contents;
  DeviceRunner runner;
  const Status paged_status = runner.forward(paged, options);
  ASSERT_TRUE(paged_status.ok()) << paged_status.to_string();
  const Status packed_status = runner.forward(packed, options);
  ASSERT_TRUE(packed_status.ok()) << packed_status.to_string();
  EXPECT_TRUE(same_bytes(paged.out, packed.out)) << "out differs from the packed call's";
  EXPECT_TRUE(same_bytes(paged.lse, packed.lse)) << "lse differs from the packed call's";
}

TEST_P(CudaPagedVarlen, SameBitsAsPackedKeys) {
  SKIP_WITHOUT_GPU();
  if (!cuda_takes_page_size(GetParam().page_size)) GTEST_SKIP() << "refused (page size)";
  expect_same_bits_as_packed(GetParam(), true);
}

// Without index checks the packed buffers are sized by batch x max_seqlen_k
// (rows past cu_seqlens_k[B] stay as the 0xFF workspace left them, unread).
TEST_P(CudaPagedVarlen, UncheckedIndicesSameBitsAsPackedKeys) {
  SKIP_WITHOUT_GPU();
  if (!cuda_takes_page_size(GetParam().page_size)) GTEST_SKIP() << "refused (page size)";
  expect_same_bits_as_packed(GetParam(), false);
}

INSTANTIATE_TEST_SUITE_P(PagedVarlen, CudaPagedVarlen, ::testing::ValuesIn(forward_cases()), CaseSpecName());

// The compute-sanitizer subset: the copy at 16-byte chunks and at 4 (f32
// rows of 40 elements: 160 bytes, strides of 16 x 40 elements), pages
// smaller than a tile and a sequence without keys.
std::vector<CaseSpec> sanitize_cases() {
  return concat(for_gpu_dtypes({in_pages(causal(varlen_case("sanitize_gqa", {5, 0, 40}, {50, 20, 0}, 4, 2, 64)), 16)},
                               {DType::bf16}),
                for_gpu_dtypes({in_pages(varlen_case("sanitize_f32_d40", {3, 9}, {33, 9}, 2, 1, 40), 16)}, kF32));
}

INSTANTIATE_TEST_SUITE_P(SanitizePagedVarlen, CudaPagedVarlen, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());

CaseSpec small_case() {
  CaseSpec s = in_pages(causal(varlen_case("small", {5, 0, 40}, {50, 20, 40}, 4, 2, 64)), 16);
  s.dtype = DType::bf16;
  return s;
}

// A block-table entry outside the cache, checked: invalid_argument naming it,
// nothing written (the workspace query, made without index contents, accepts).
TEST(CudaPagedVarlenIndices, BadEntryRefusedNothingWritten) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(small_case(), rng.engine());
  c.block_table.set(c.max_pages + 1, c.k.shape()[0]);  // sequence 1's second page: its keys 16..19
  const AttentionCase before = c;
  DeviceRunner runner;
  const Status status = runner.forward(c, c.options(Backend::cuda));
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("kv_cache.block_table"), std::string::npos) << status.message();
  expect_case_unchanged(before, c);
}

// The same table unchecked: the call runs and stays inside every tensor (the
// runner's guard bytes); the keys of the bad page read as zeros.
TEST(CudaPagedVarlenIndices, UncheckedBadEntriesStayInside) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(small_case(), rng.engine());
  c.block_table.set(c.max_pages + 1, c.k.shape()[0] + 1000);
  c.block_table.set(0, -5);
  const AttentionCase before = c;
  AttentionOptions options = c.options(Backend::cuda);
  options.check_index_contents = false;
  DeviceRunner runner;
  const Status status = runner.forward(c, options);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(same_bytes(before.k, c.k) && same_bytes(before.v, c.v)) << "the cache was written";
}

TEST(CudaPagedVarlenWorkspace, NoneGivenAndTooSmall) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  {
    AttentionCase c(small_case(), rng.engine());
    DeviceRunner runner;
    runner.workspace_mode = WorkspaceMode::none;
    check_forward_gpu(c, runner);
  }
  // Unchecked, the call packs as many rows as the query counted (batch x
  // max_seqlen_k; checked, it would pack only the 110 keys there are).
  AttentionCase c(small_case(), rng.engine());
  const AttentionCase before = c;
  AttentionOptions options = c.options(Backend::cuda);
  options.check_index_contents = false;
  DeviceRunner runner;
  runner.workspace_mode = WorkspaceMode::too_small;
  const Status status = runner.forward(c, options);
  ASSERT_TRUE(runner.last_workspace_status.ok()) << runner.last_workspace_status.to_string();
  ASSERT_GT(runner.last_workspace_bytes, 0u) << "the packed keys live in the workspace";
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  expect_case_unchanged(before, c);
}

TEST(CudaPagedVarlenBackends, AutoRunsItAndCudnnRefusesByName) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(small_case(), rng.engine());
  DeviceRunner automatic(Backend::automatic);
  check_forward_gpu(c, automatic);
  if (backend_available(Backend::cudnn)) check_cudnn_case(small_case(), TestPass::forward);  // refused: block_table
}

}  // namespace
}  // namespace cuflash::test
