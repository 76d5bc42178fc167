// The KV-cache forward cases every backend's suite runs (no dtype yet; the
// suites give each case their dtypes): contiguous and paged (page sizes 1, 16,
// 64, shuffled block tables), decode and prefill, with and without an append,
// windows, softcap, ALiBi, GQA, strided views, a shared prefix page, more
// queries than keys, a leftpad and a rotary embedding. Three sequences of 4
// query heads over 2 KV heads, head dim 64, causal, unless a case says otherwise.
#pragma once

#include <string>
#include <vector>

#include "attention_case.hpp"

namespace cuflash::test {

// A causal KV-cache case of 4 query heads over 2 KV heads, head dim 64;
// page_size 0: a contiguous cache. Sequence 1 of the default lengths starts
// empty: with no append it has no key at all.
CaseSpec kv_cache_case(std::string label, int page_size, int q_len, int new_len,
                       std::vector<int> cached = {37, 0, 70});

std::vector<CaseSpec> kv_cache_cases();  // ... with kv_cache_option_cases() at the end

// flash-attn's cache_leftpad and rotary embedding (rotary_cos/rotary_sin,
// GPT-NeoX or interleaved), alone and together, with masks, ALiBi and appends.
std::vector<CaseSpec> kv_cache_option_cases();

}  // namespace cuflash::test
