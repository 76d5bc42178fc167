// backend=cuda forward against the float64 oracle over the GPU forward matrix
// (forward_matrix.hpp: head dims, lengths 1 to 4097, GQA, every option alone
// and combined, varlen, split-KV). Inputs are fresh random values
// (CUFLASH_TEST_SEED replays a failure); outputs start as NaN on the device,
// inputs must come back unchanged.
#include <gtest/gtest.h>

#include "device_runner.hpp"
#include "forward_matrix.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

namespace matrix = forward_matrix;

class CudaForward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaForward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_forward_gpu(c, runner);
  expect_unowned_out_rows_untouched(c);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudaForward, ::testing::ValuesIn(matrix::head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Lengths, CudaForward, ::testing::ValuesIn(matrix::length_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Gqa, CudaForward, ::testing::ValuesIn(matrix::gqa_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Causal, CudaForward, ::testing::ValuesIn(matrix::causal_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Options, CudaForward, ::testing::ValuesIn(matrix::option_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Varlen, CudaForward, ::testing::ValuesIn(matrix::varlen_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(SplitKv, CudaForward, ::testing::ValuesIn(matrix::split_kv_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(HopperTma, CudaForward, ::testing::ValuesIn(matrix::tma_cases()), CaseSpecName());
// The compute-sanitizer subset: every forward kernel once, small shapes.
INSTANTIATE_TEST_SUITE_P(Sanitize, CudaForward, ::testing::ValuesIn(matrix::sanitize_cases()), CaseSpecName());

class CudaForwardMaskedRows : public ::testing::TestWithParam<DtypeParam> {};

TEST_P(CudaForwardMaskedRows, ZeroOutputAndNegativeInfinityLse) {
  SKIP_WITHOUT_GPU();
  check_masked_rows(GetParam().dtype, Backend::cuda);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaForwardMaskedRows, all_dtype_params(), dtype_param_name);

// backend auto with GPU memory picks one of the GPU backends (auto_table.hpp) and runs.
TEST(CudaForwardAuto, AutoRunsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(dense_case("auto", 65, 130, 4, 2, 128));
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(Backend::automatic);
  check_forward_gpu(c, runner);
}

}  // namespace
}  // namespace cuflash::test
