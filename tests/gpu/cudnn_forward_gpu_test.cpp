// backend=cudnn forward against the float64 oracle over the same matrix as
// backend=cuda (forward_matrix.hpp), the KV-cache cases (contiguous and paged)
// and their GPU-sized and decode-shaped additions (decode_cases.hpp): every case cuDNN can run must match, every
// other one must be refused as `unsupported` naming the option, with nothing
// written (cudnn_cases.hpp says which is which).
#include <gtest/gtest.h>

#include "cudnn_cases.hpp"
#include "common/decode_cases.hpp"
#include "device_runner.hpp"
#include "forward_matrix.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

namespace matrix = forward_matrix;

class CudnnForward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudnnForward, MatchesOracleOrRefused) {
  SKIP_WITHOUT_CUDNN();
  check_cudnn_case(GetParam(), TestPass::forward);
}

std::vector<CaseSpec> kv_cases() {
  return for_gpu_dtypes(concat(concat(kv_cache_cases(), gpu_kv_cache_cases()), decode_cases()), kHalfDtypes);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, CudnnForward, ::testing::ValuesIn(matrix::head_dim_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Lengths, CudnnForward, ::testing::ValuesIn(matrix::length_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Gqa, CudnnForward, ::testing::ValuesIn(matrix::gqa_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Causal, CudnnForward, ::testing::ValuesIn(matrix::causal_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Options, CudnnForward, ::testing::ValuesIn(matrix::option_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Varlen, CudnnForward, ::testing::ValuesIn(matrix::varlen_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(SplitKv, CudnnForward, ::testing::ValuesIn(matrix::split_kv_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(KvCache, CudnnForward, ::testing::ValuesIn(kv_cases()), CaseSpecName());

// The compute-sanitizer subset for cuDNN: dense, varlen, paged and contiguous
// caches, a bottom-right band with padding, small shapes.
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s, DType dtype) {
    s.dtype = dtype;
    cases.push_back(std::move(s));
  };
  add(causal(dense_case("cudnn_fwd_gqa_causal_d64", 65, 130, 4, 2, 64)), DType::bf16);
  add(causal(dense_case("cudnn_fwd_causal_q_longer_d128", 70, 33, 2, 1, 128, 1)), DType::f16);
  CaseSpec s = dense_case("cudnn_fwd_window_bhsd_d96", 40, 70, 2, 2, 96, 1);
  s.options.window_left = 16;
  s.options.window_right = 8;
  s.bhsd = true;
  add(s, DType::bf16);
  add(causal(varlen_case("cudnn_fwd_varlen_causal", {5, 0, 70, 1}, {5, 0, 70, 1}, 4, 2, 64)), DType::bf16);
  add(varlen_case("cudnn_fwd_varlen_cross_d128", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 1, 128), DType::f16);
  add(kv_cache_case("cudnn_fwd_paged16_decode", 16, 1, 0), DType::bf16);
  add(kv_cache_case("cudnn_fwd_contiguous_prefill4", 0, 4, 0), DType::f16);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Sanitize, CudnnForward, ::testing::ValuesIn(sanitize_cases()), CaseSpecName());

class CudnnForwardMaskedRows : public ::testing::TestWithParam<DtypeParam> {};

TEST_P(CudnnForwardMaskedRows, ZeroOutputAndNegativeInfinityLse) {
  SKIP_WITHOUT_CUDNN();
  check_masked_rows(GetParam().dtype, Backend::cudnn);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudnnForwardMaskedRows,
                         ::testing::Values(DtypeParam{DType::bf16}, DtypeParam{DType::f16}), dtype_param_name);

}  // namespace
}  // namespace cuflash::test
