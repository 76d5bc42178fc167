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
  for (CaseSpec& option_case : kv_cache_option_cases()) add(std::move(option_case));
  return cases;
}

std::vector<CaseSpec> kv_cache_option_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  // cache_leftpad: the rows before it are NaN. A leftpad equal to the cached
  // length leaves the appended keys only, or (no append) no key at all.
  CaseSpec s = kv_cache_case("contiguous_leftpad_decode_append1", 0, 1, 1, {37, 5, 70});
  s.leftpad = {10, 5, 0};
  add(s);
  s = kv_cache_case("contiguous_leftpad_prefill4_append4", 0, 4, 4, {37, 0, 70});
  s.leftpad = {3, 0, 64};
  add(s);
  s = kv_cache_case("contiguous_leftpad_not_causal_q3", 0, 3, 0, {37, 20, 70});
  s.leftpad = {36, 20, 1};
  s.options.causal = false;
  add(s);
  s = kv_cache_case("contiguous_leftpad_window_alibi", 0, 4, 2, {37, 12, 70});
  s.leftpad = {30, 2, 65};
  s.options.window_left = 9;
  s.alibi = AlibiKind::per_batch;
  add(s);
  // ... in a paged cache: a leftpad counts key positions, the block table
  // maps them to rows (one page or several before it, none at all).
  s = kv_cache_case("paged16_leftpad_prefill3_append2", 16, 3, 2, {37, 5, 70});
  s.leftpad = {33, 0, 16};
  add(s);
  s = kv_cache_case("paged1_leftpad_rotary_neox_append3", 1, 3, 3, {37, 5, 70});
  s.leftpad = {10, 5, 69};
  s.rotary_dim = 32;
  add(s);
  // Rotary embedding of q and k_new: GPT-NeoX halves and GPT-J pairs, a part
  // of the head or all of it, 20 columns (halves of 10: no 16-byte chunk
  // boundary), queries at their own positions (causal, windowed) or all at
  // the cached length (neither), more queries than appended keys.
  auto rotary = [](std::string label, int page_size, int q_len, int new_len, int rotary_dim, bool interleaved) {
    CaseSpec r = kv_cache_case(std::move(label), page_size, q_len, new_len);
    r.rotary_dim = rotary_dim;
    r.rotary_interleaved = interleaved;
    return r;
  };
  add(rotary("paged16_rotary_neox_append3", 16, 3, 3, 32, false));
  s = rotary("contiguous_rotary_interleaved_not_causal", 0, 2, 2, 32, true);
  s.options.causal = false;
  add(s);
  add(rotary("paged64_rotary_neox_whole_head_prefill5", 64, 5, 5, 64, false));
  add(rotary("contiguous_rotary_neox_dim20_append2", 0, 2, 2, 20, false));
  add(rotary("paged16_rotary_interleaved_q4_append2", 16, 4, 2, 16, true));
  // Both: keys rotated at their cache rows, not counted from the leftpad.
  s = kv_cache_case("contiguous_leftpad_rotary_interleaved_window", 0, 3, 3, {37, 4, 70});
  s.leftpad = {5, 4, 33};
  s.rotary_dim = 48;
  s.rotary_interleaved = true;
  s.options.causal = false;
  s.options.window_left = 20;
  s.options.window_right = 0;
  add(s);
  return cases;
}

}  // namespace cuflash::test
