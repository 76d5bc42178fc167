#include "kv_cache_cases.hpp"

#include <string>
#include <utility>

namespace cuflash::test {

CaseSpec kv_cache_case(std::string label, int page_size, int q_len, int new_len, std::vector<int> cached) {
  CaseSpec s;
  s.label = std::move(label);
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

std::vector<CaseSpec> kv_cache_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  for (int page : {0, 1, 16, 64}) {
    const std::string p = page == 0 ? "contiguous" : "paged" + std::to_string(page);
    add(kv_cache_case(p + "_decode", page, 1, 0));
    add(kv_cache_case(p + "_decode_append1", page, 1, 1));
    add(kv_cache_case(p + "_prefill4_append4", page, 4, 4));
    CaseSpec s = kv_cache_case(p + "_not_causal_q3", page, 3, 0);
    s.options.causal = false;
    add(s);
  }
  CaseSpec s;
  // More new keys than fit on one page: the append crosses page boundaries.
  add(kv_cache_case("paged16_append40", 16, 5, 40, {10, 0, 33}));
  s = kv_cache_case("paged16_window_alibi", 16, 4, 2);
  s.options.window_left = 9;
  s.alibi = AlibiKind::per_batch;
  add(s);
  s = kv_cache_case("paged64_softcap_gqa8", 64, 2, 3);
  s.heads_q = 8;
  s.heads_kv = 1;
  s.options.softcap = 2.0f;
  s.alibi = AlibiKind::per_head;
  add(s);
  s = kv_cache_case("paged1_bhsd", 1, 3, 2);
  s.bhsd = true;
  add(s);
  s = kv_cache_case("contiguous_padded_d128", 0, 2, 2);
  s.row_padding = 4;
  s.head_dim = 128;
  add(s);
  // Prefix caching: every sequence's first page is sequence 0's.
  s = kv_cache_case("paged16_shared_prefix_page", 16, 2, 0, {37, 20, 70});
  s.share_first_page = true;
  add(s);
  // A long decode step: 1000 cached keys over 63 pages, one appended.
  s = kv_cache_case("paged16_long_decode_append1", 16, 1, 1, {1000, 517});
  s.heads_q = 8;
  s.heads_kv = 1;
  add(s);
  for (int d : {40, 256}) {
    s = kv_cache_case("paged16_d" + std::to_string(d), 16, 3, 2);
    s.head_dim = d;
    add(s);
  }
  // More queries than keys: the first rows see nothing.
  s = kv_cache_case("contiguous_q_longer_than_keys", 0, 9, 2, {3, 0, 1});
  add(s);
  return cases;
}

}  // namespace cuflash::test
