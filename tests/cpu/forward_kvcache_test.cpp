// CPU forward over KV caches against the float64 oracle: contiguous and paged
// (page sizes 1, 16, 64, shuffled block tables), with and without an append.
// check_forward also verifies the cache afterwards: append slots hold exactly
// k_new/v_new and every other slot, guard pages included, is bit-identical.
// Slots that hold no cached key start as NaN, so reading one shows.
#include <gtest/gtest.h>

#include "common/attention_check.hpp"
#include "common/kv_cache_cases.hpp"

namespace cuflash::test {
namespace {

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

class CpuForwardKvCache : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardKvCache, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

INSTANTIATE_TEST_SUITE_P(KvCache, CpuForwardKvCache, ::testing::ValuesIn(for_dtypes(kv_cache_cases(), kAllDtypes)),
                         CaseSpecName());

}  // namespace
}  // namespace cuflash::test
