// backend=cuda with attention sinks (gpt-oss) against the float64 oracle:
// the kernels run without them and the sinks join each row's softmax state
// afterwards (src/cuda/common/attention_sinks.hpp), so every forward path is
// here once with sinks (sm80, wgmma/TMA on Hopper, f32, varlen with rows of
// no key, split-KV, KV cache decode and prefill, no caller lse), and the
// backward's dq, dk, dv and dsinks (dense, varlen, f32, deterministic).
#include <gtest/gtest.h>

#include "common/kv_cache_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

CaseSpec sinks(CaseSpec s) {
  s.sinks = true;
  return s;
}

std::vector<CaseSpec> forward_cases() {
  std::vector<CaseSpec> half = {
      sinks(causal(dense_case("sinks_causal_gqa", 65, 200, 4, 2, 64))),
      sinks(causal(dense_case("sinks_causal_q_longer", 90, 40, 4, 2, 64))),  // rows with no key: lse = sink
      sinks(causal(dense_case("sinks_tma_d128_k2048", 300, 2048, 4, 2, 128, 1))),
      sinks(dense_case("sinks_d256", 70, 300, 2, 1, 256, 1)),
      sinks(dense_case("sinks_splitkv_q1_k4097", 1, 4097, 2, 1, 128, 1)),
      sinks(causal(varlen_case("sinks_varlen_causal", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 64))),
      sinks(kv_cache_case("sinks_paged16_decode", 16, 1, 0)),
      sinks(kv_cache_case("sinks_paged16_prefill9_append3", 16, 9, 3)),
  };
  CaseSpec s = sinks(dense_case("sinks_softcap_alibi_window_no_lse_bhsd", 45, 77, 4, 2, 64));
  s.options.softcap = 5.0f;
  s.options.window_left = 20;
  s.options.window_right = 3;
  s.alibi = AlibiKind::per_batch;
  s.with_lse = false;  // the sinks need the kernels' lse: scratch then
  s.bhsd = true;
  half.push_back(s);
  return concat(for_gpu_dtypes(half, kHalfDtypes),
                for_gpu_dtypes({sinks(causal(dense_case("sinks_f32_causal", 33, 47, 4, 2, 64))),
                                sinks(causal(varlen_case("sinks_f32_varlen", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 40)))},
                               kF32));
}

std::vector<CaseSpec> backward_cases() {
  std::vector<CaseSpec> half = {
      sinks(causal(dense_case("sinks_causal_gqa", 65, 200, 4, 2, 64))),
      sinks(causal(dense_case("sinks_causal_q_longer_d128", 90, 40, 4, 2, 128))),
      sinks(causal(varlen_case("sinks_varlen_causal", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 64))),
  };
  CaseSpec s = sinks(dense_case("sinks_deterministic_softcap", 70, 130, 4, 1, 64));
  s.options.deterministic = true;
  s.options.softcap = 3.0f;
  half.push_back(s);
  return concat(for_gpu_dtypes(half, kHalfDtypes),
                for_gpu_dtypes({sinks(causal(dense_case("sinks_f32_causal", 33, 47, 4, 2, 64)))}, kF32));
}

class CudaSinksForward : public ::testing::TestWithParam<CaseSpec> {};
class CudaSinksBackward : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CudaSinksForward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_forward_gpu(c, runner);
  expect_unowned_out_rows_untouched(c);
}

TEST_P(CudaSinksBackward, MatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  DeviceRunner runner;
  check_backward_gpu(c, runner);
}

INSTANTIATE_TEST_SUITE_P(Sinks, CudaSinksForward, ::testing::ValuesIn(forward_cases()), CaseSpecName());
INSTANTIATE_TEST_SUITE_P(Sinks, CudaSinksBackward, ::testing::ValuesIn(backward_cases()), CaseSpecName());

}  // namespace
}  // namespace cuflash::test
