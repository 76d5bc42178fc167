// CPU forward over KV caches against the float64 oracle: contiguous and paged
// (page sizes 1, 16, 64, shuffled block tables), with and without an append.
// check_forward also verifies the cache afterwards: append slots hold exactly
// k_new/v_new and every other slot, guard pages included, is bit-identical.
// Slots that hold no cached key start as NaN, so reading one shows.
#include <gtest/gtest.h>

#include "common/attention_check.hpp"

namespace cuflash::test {
namespace {

const std::vector<DType> kAllDtypes = {DType::f32, DType::f16, DType::bf16};

// Sequence 1 starts empty: with no append it has no key at all.
const std::vector<int> kCached = {37, 0, 70};

CaseSpec cache(const char* label, int page_size, int q_len, int new_len, std::vector<int> cached = kCached) {
  CaseSpec s;
  s.label = label;
  s.layout = CaseLayout::kv_cache;
  s.cached_lens = std::move(cached);
  s.page_size = page_size;
  s.q_len = q_len;
  s.new_len = new_len;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim = 64;
  s.options.causal = true;
  return s;
}

class CpuForwardKvCache : public ::testing::TestWithParam<CaseSpec> {};

TEST_P(CpuForwardKvCache, MatchesOracle) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(GetParam(), rng.engine());
  HostApiRunner runner(Backend::cpu);
  check_forward(c, runner);
}

std::vector<CaseSpec> cache_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  for (int page : {0, 1, 16, 64}) {
    const std::string p = page == 0 ? "contiguous" : "paged" + std::to_string(page);
    add(cache((p + "_decode").c_str(), page, 1, 0));
    add(cache((p + "_decode_append1").c_str(), page, 1, 1));
    add(cache((p + "_prefill4_append4").c_str(), page, 4, 4));
    CaseSpec s = cache((p + "_not_causal_q3").c_str(), page, 3, 0);
    s.options.causal = false;
    add(s);
  }
  CaseSpec s;
  // More new keys than fit on one page: the append crosses page boundaries.
  add(cache("paged16_append40", 16, 5, 40, {10, 0, 33}));
  s = cache("paged16_window_alibi", 16, 4, 2);
  s.options.window_left = 9;
  s.alibi = AlibiKind::per_batch;
  add(s);
  s = cache("paged64_softcap_gqa8", 64, 2, 3);
  s.heads_q = 8;
  s.heads_kv = 1;
  s.options.softcap = 2.0f;
  s.alibi = AlibiKind::per_head;
  add(s);
  s = cache("paged1_bhsd", 1, 3, 2);
  s.bhsd = true;
  add(s);
  s = cache("contiguous_padded_d128", 0, 2, 2);
  s.row_padding = 4;
  s.head_dim = 128;
  add(s);
  // Prefix caching: every sequence's first page is sequence 0's.
  s = cache("paged16_shared_prefix_page", 16, 2, 0, {37, 20, 70});
  s.share_first_page = true;
  add(s);
  // A long decode step: 1000 cached keys over 63 pages, one appended.
  s = cache("paged16_long_decode_append1", 16, 1, 1, {1000, 517});
  s.heads_q = 8;
  s.heads_kv = 1;
  add(s);
  for (int d : {40, 256}) {
    s = cache(("paged16_d" + std::to_string(d)).c_str(), 16, 3, 2);
    s.head_dim = d;
    add(s);
  }
  // More queries than keys: the first rows see nothing.
  s = cache("contiguous_q_longer_than_keys", 0, 9, 2, {3, 0, 1});
  add(s);
  return for_dtypes(cases, kAllDtypes);
}

INSTANTIATE_TEST_SUITE_P(KvCache, CpuForwardKvCache, ::testing::ValuesIn(cache_cases()), CaseSpecName());

}  // namespace
}  // namespace cuflash::test
