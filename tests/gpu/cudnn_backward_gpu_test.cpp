// backend=cudnn backward against the oracle's analytic float64 gradients over
// the same matrix as backend=cuda (backward_matrix.hpp): cases cuDNN can run
// must match, the others must be refused naming the option (cudnn_cases.hpp),
// KV caches included (cuDNN's paged attention is forward-only).
// deterministic = true (cuDNN's deterministic algorithm) must give the same
// bits twice.
#include <gtest/gtest.h>

#include "backward_matrix.hpp"
#include "cudnn_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

namespace matrix = backward_matrix;

class CudnnBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudnnBackward, MatchesOracleOrRefused) {
  SKIP_WITHOUT_CUDNN();
  check_cudnn_case(GetParam(), TestPass::backward);
}

std::vector<CaseSpec> kv_cases() {
  std::vector<CaseSpec> cases;
  for (const CaseSpec& s : kv_cache_cases())
    if (s.new_len == 0) cases.push_back(s);  // (an append is refused by validation before any backend)
  return for_gpu_dtypes(cases, kHalfDtypes);
}

INSTANTIATE_TEST_SUITE_P(Dense, CudnnBackward, ::testing::ValuesIn(matrix::dense_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(HeadDims, CudnnBackward, ::testing::ValuesIn(matrix::head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Lengths, CudnnBackward, ::testing::ValuesIn(matrix::length_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Gqa, CudnnBackward, ::testing::ValuesIn(matrix::gqa_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Options, CudnnBackward, ::testing::ValuesIn(matrix::option_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Varlen, CudnnBackward, ::testing::ValuesIn(matrix::varlen_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(KvCache, CudnnBackward, ::testing::ValuesIn(kv_cases()), CaseSpecName());

// The compute-sanitizer subset for cuDNN's backward: dense, a band with
// unseen keys, varlen with empty sequences.
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s, DType dtype) {
    s.dtype = dtype;
    cases.push_back(std::move(s));
  };
  add(causal(dense_case("cudnn_bwd_gqa_causal_d64", 65, 130, 4, 2, 64, 1)), DType::bf16);
  CaseSpec s = dense_case("cudnn_bwd_window_d128", 40, 70, 2, 1, 128, 1);
  s.options.window_left = 8;
  s.options.window_right = 0;
  add(s, DType::f16);
  add(causal(varlen_case("cudnn_bwd_varlen_causal", {5, 0, 70, 7}, {12, 3, 70, 0}, 4, 2, 64)), DType::bf16);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sanitize, CudnnBackward, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());

class CudnnBackwardDeterministic : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudnnBackwardDeterministic, TwoRunsBitwiseEqualOrRefused) {
  SKIP_WITHOUT_CUDNN();
  CaseSpec spec = GetParam();
  spec.options.deterministic = true;
  if (!cudnn_refusal(spec, TestPass::backward).empty()) return check_cudnn_case(spec, TestPass::backward);
  check_deterministic_backward(spec, Backend::cudnn);
}

INSTANTIATE_TEST_SUITE_P(Gqa, CudnnBackwardDeterministic, ::testing::ValuesIn(matrix::deterministic_cases()),
                         CaseSpecName());

}  // namespace
}  // namespace cuflash::test
