// backend=cuda backward against the oracle's analytic float64 gradients (dq,
// dk, dv) over the GPU backward matrix (backward_matrix.hpp), fed the
// oracle's exact forward (out rounded to the dtype, lse to f32). The default
// backward accumulates dq with atomics; deterministic = true must give the
// same bits twice. Gradients start as NaN on the device.
#include <gtest/gtest.h>

#include "backward_matrix.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

namespace matrix = backward_matrix;

class CudaBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaBackward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_backward_gpu(c, runner);
}

INSTANTIATE_TEST_SUITE_P(Dense, CudaBackward, ::testing::ValuesIn(matrix::dense_cases()), CaseSpecName());
// The Hopper TMA kernel's cases (every one at its head dim, 128).
INSTANTIATE_TEST_SUITE_P(HopperTma, CudaBackward, ::testing::ValuesIn(matrix::hopper_tma_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(HeadDims, CudaBackward, ::testing::ValuesIn(matrix::head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Lengths, CudaBackward, ::testing::ValuesIn(matrix::length_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Gqa, CudaBackward, ::testing::ValuesIn(matrix::gqa_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Options, CudaBackward, ::testing::ValuesIn(matrix::option_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Varlen, CudaBackward, ::testing::ValuesIn(matrix::varlen_cases()), CaseSpecName());
// The compute-sanitizer subset: each backward kernel (atomic dq) once, small shapes.
INSTANTIATE_TEST_SUITE_P(Sanitize, CudaBackward, ::testing::ValuesIn(matrix::sanitize_cases()), CaseSpecName());

// deterministic = true: several key blocks and a GQA group make many
// contributions meet in one dq (over key blocks) and one dk/dv element (over
// the group's heads).
class CudaBackwardDeterministic : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaBackwardDeterministic, TwoRunsBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  check_deterministic_backward(GetParam(), Backend::cuda);
}

INSTANTIATE_TEST_SUITE_P(Gqa, CudaBackwardDeterministic, ::testing::ValuesIn(matrix::deterministic_cases()),
                         CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Sanitize, CudaBackwardDeterministic,
                         ::testing::ValuesIn(matrix::sanitize_deterministic_cases()), CaseSpecName());

}  // namespace
}  // namespace cuflash::test
