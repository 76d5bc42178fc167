// The decode-shaped KV-cache cases the GPU suites run on top of
// kv_cache_cases() and gpu_kv_cache_cases(): cache lengths 0, 1 and a page
// boundary +-1 for every page size 16..256 (and pages of 4 and 8, below the
// loader's row step), GQA groups processed together
// (group x q_len from 1 to 64 query rows per kv head: one or several row
// blocks), speculative decode (q_len 4..16 with as many keys appended),
// chunked prefill, long single-sequence caches that take split-KV, the score
// options, every head dim, calls whose indices are read on the device only
// (check_index_contents off), both CTA shapes of the kernel (per kv head
// and wide), and a leftpad and a rotary embedding (decode_option_cases). No
// dtype yet: the suites give them theirs.
#pragma once

#include <string>
#include <vector>

#include "kv_cache_cases.hpp"

namespace cuflash::test {

inline CaseSpec decode_case(std::string label, int page_size, int q_len, int new_len, std::vector<int> cached,
                            int heads_q, int heads_kv, int head_dim) {
  CaseSpec s = kv_cache_case(std::move(label), page_size, q_len, new_len, std::move(cached));
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  return s;
}

// cache_leftpad and the rotary embedding in decode shapes: leftpads at and
// around the kernel's 64-key tiles (and the wide CTA's 16), a split-KV over
// [leftpad, end) of a long cache, score options, every head dim's rotated Q
// load and append (GPT-NeoX halves of whole 16-byte chunks, and of 20
// columns; GPT-J pairs), speculative decode and a prefill chunk, indices read
// on the device only, and the wide CTA.
inline std::vector<CaseSpec> decode_option_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s = decode_case("contiguous_leftpad_edges_gqa4_append1", 0, 1, 1, {0, 1, 63, 64, 65, 200, 129}, 8, 2, 128);
  s.leftpad = {0, 1, 62, 64, 1, 128, 64};
  add(s);
  s = decode_case("contiguous_long_b1_leftpad_split", 0, 1, 1, {5000}, 8, 2, 128);
  s.leftpad = {1700};
  add(s);
  s = decode_case("contiguous_long_leftpad_window_softcap_alibi", 0, 2, 1, {3000, 40}, 8, 2, 128);
  s.leftpad = {2000, 39};
  s.options.window_left = 100;
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_head;
  add(s);
  for (int d : {32, 64, 96, 128, 192, 256}) {
    s = decode_case("contiguous_rotary_d" + std::to_string(d) + "_append1", 0, 1, 1, {300, 0, 65}, 8, 2, d);
    s.rotary_dim = d / 2;
    s.rotary_interleaved = d % 64 != 0;
    s.leftpad = {50, 0, 64};
    add(s);
  }
  s = decode_case("paged16_rotary_neox_dim40_spec4_append4", 16, 4, 4, {300, 0, 1000}, 8, 2, 128);
  s.rotary_dim = 40;
  add(s);
  s = decode_case("paged32_rotary_neox_chunk100_append100", 32, 100, 100, {300, 0, 700}, 4, 2, 64);
  s.rotary_dim = 64;
  add(s);
  s = decode_case("paged16_rotary_interleaved_not_causal_spec4", 16, 4, 4, {300, 9, 64}, 8, 2, 128);
  s.rotary_dim = 128;
  s.rotary_interleaved = true;
  s.options.causal = false;
  add(s);
  s = decode_case("contiguous_leftpad_rotary_unchecked_indices", 0, 2, 2, {3000, 0, 65}, 8, 2, 128);
  s.leftpad = {1000, 0, 60};
  s.rotary_dim = 64;
  s.options.check_index_contents = false;
  add(s);
  s = decode_case("wide_contiguous_leftpad_rotary_neox", 0, 1, 1, {300, 17, 1000, 65}, 16, 8, 128);
  s.leftpad = {100, 16, 999, 0};
  s.rotary_dim = 64;
  add(s);
  s = decode_case("wide_contiguous_long_b1_leftpad_split", 0, 1, 1, {5000}, 32, 8, 128);
  s.leftpad = {3001};
  add(s);
  // A leftpad in a paged cache (flash-attn refuses the pair; cuflash maps a
  // leftpad's key positions through the block table): inside and at the edge
  // of a page and of a tile, split over [leftpad, end), page sizes of 1, 16
  // and 64 keys, the wide CTA.
  s = decode_case("paged16_leftpad_edges_append1", 16, 1, 1, {0, 17, 63, 64, 200, 129}, 8, 2, 128);
  s.leftpad = {0, 16, 62, 33, 128, 65};
  add(s);
  s = decode_case("paged64_long_b1_leftpad_split_rotary", 64, 1, 1, {5000}, 8, 2, 128);
  s.leftpad = {1701};
  s.rotary_dim = 128;
  add(s);
  s = decode_case("paged1_leftpad_spec4", 1, 4, 4, {300, 0, 65}, 4, 2, 64);
  s.leftpad = {77, 0, 1};
  add(s);
  s = decode_case("wide_paged16_leftpad_split", 16, 1, 1, {3000, 40}, 32, 8, 128);
  s.leftpad = {2999, 20};
  add(s);
  s = decode_case("wide_contiguous_leftpad_rotary_interleaved_d64", 0, 2, 1, {300, 0, 1000}, 16, 8, 64);
  s.leftpad = {15, 0, 17};
  s.rotary_dim = 32;
  s.rotary_interleaved = true;
  add(s);
  return cases;
}

inline std::vector<CaseSpec> decode_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  // Lengths at the edges: empty, one key, a page boundary -1/0/+1 (and, for
  // 16, the kernel's 64-key tile boundary too), with and without an append.
  for (int page : {0, 16, 32, 64, 128, 256}) {
    const int edge = page == 0 ? 64 : page;
    const std::string p = page == 0 ? "contiguous" : "paged" + std::to_string(page);
    const std::vector<int> lengths = {0, 1, edge - 1, edge, edge + 1, 63, 64, 65};
    add(decode_case(p + "_lengths_edges_gqa4", page, 1, 0, lengths, 8, 2, 128));
    add(decode_case(p + "_lengths_edges_gqa4_append1", page, 1, 1, lengths, 8, 2, 128));
  }
  // The GQA group and q_len fill 1..64 query rows per kv head.
  add(decode_case("paged16_mha_decode", 16, 1, 1, {300, 17, 1000}, 4, 4, 128));
  add(decode_case("paged64_mqa8_decode", 64, 1, 1, {300, 17, 1000}, 8, 1, 128));
  add(decode_case("paged16_gqa4_spec4_append4", 16, 4, 4, {300, 0, 1000}, 8, 2, 128));
  add(decode_case("paged32_gqa4_spec8_append8", 32, 8, 8, {300, 0, 1000}, 8, 2, 128));
  add(decode_case("paged64_gqa4_spec16_append16", 64, 16, 16, {300, 5, 1000}, 8, 2, 128));
  add(decode_case("paged16_gqa8_q3_rows24", 16, 3, 3, {100, 64, 200}, 8, 1, 64));
  add(decode_case("paged16_gqa8_q3_rows24_d256", 16, 3, 3, {100, 64, 200}, 8, 1, 256));
  // Chunked prefill: a 100-token chunk appended and attended causally.
  add(decode_case("paged32_chunk100_append100", 32, 100, 100, {300, 0, 700}, 4, 2, 64));
  add(decode_case("contiguous_chunk70_no_append", 0, 70, 0, {300, 70, 500}, 4, 1, 128));
  // One long sequence: few CTAs, so the keys are split (and combined).
  add(decode_case("paged16_long_b1_gqa4", 16, 1, 1, {5000}, 8, 2, 128));
  add(decode_case("contiguous_long_b1_mha", 0, 1, 0, {4097}, 2, 2, 128));
  add(decode_case("paged256_long_b2_spec4", 256, 4, 4, {3000, 6000}, 8, 2, 64));
  // Score options on a split, paged cache.
  CaseSpec s = decode_case("paged16_long_window100", 16, 2, 1, {3000, 40}, 8, 2, 128);
  s.options.window_left = 100;
  add(s);
  s = decode_case("paged64_long_softcap_alibi_heads", 64, 1, 1, {3000, 40}, 8, 2, 128);
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_head;
  add(s);
  s = decode_case("paged32_alibi_per_batch_spec4", 32, 4, 2, {500, 3, 77}, 8, 2, 64);
  s.alibi = AlibiKind::per_batch;
  add(s);
  s = decode_case("paged16_not_causal_window_right", 16, 5, 0, {200, 9, 64}, 8, 2, 128);
  s.options.causal = false;
  s.options.window_left = 20;
  s.options.window_right = 3;
  add(s);
  // Every head dim of the kernels.
  for (int d : {32, 64, 96, 192, 256})
    add(decode_case("paged16_d" + std::to_string(d) + "_append1", 16, 1, 1, {300, 0, 65}, 8, 2, d));
  // Pages smaller than the kernel's tiles at the loader's edges (D=128: a
  // thread loads rows 8 apart, so page 8 is one row per page and per shuffle,
  // page 4 is loaded row by row; D=64's rows are 16 apart, so page 8 is too),
  // over several tiles and a partial last one.
  for (int page : {4, 8}) {
    add(decode_case("paged" + std::to_string(page) + "_d128_small_pages", page, 1, 1, {300, 0, 129}, 8, 2, 128));
    add(decode_case("paged" + std::to_string(page) + "_d64_small_pages", page, 2, 1, {300, 7, 64}, 8, 2, 64));
  }
  // Indices read on the device only (no host copy, no content check).
  for (int page : {0, 16}) {
    s = decode_case(std::string(page == 0 ? "contiguous" : "paged16") + "_unchecked_indices", page, 2, 2,
                    {3000, 0, 65}, 8, 2, 128);
    s.options.check_index_contents = false;
    add(s);
  }
  // Pages that are no power of two but a multiple of 64 keys (flash-attn's
  // are multiples of 256): page and slot by division; tiles at a page's end,
  // a split, the wide CTA.
  add(decode_case("paged192_lengths_edges_append1", 192, 1, 1, {0, 191, 192, 193, 1000}, 8, 2, 128));
  add(decode_case("paged768_long_b1_spec4", 768, 4, 4, {5000}, 8, 2, 64));
  add(decode_case("wide_paged320_split", 320, 1, 1, {3000, 319, 321}, 32, 8, 128));
  s = decode_case("paged64_no_lse_bhsd", 64, 1, 1, {300, 0, 1000}, 8, 2, 128);
  s.with_lse = false;
  s.bhsd = true;
  add(s);
  // The wide CTA (a warp per kv head, 8 heads at D=64/128, 4 at D=256, 16-key
  // tiles; up to 16 query rows per kv head): length edges, two head blocks
  // per sequence (16 kv heads), the 16-row limit (q_len 4 x group 4; q_len 5
  // takes the per-head kernel), long splits with score options, pages from
  // one row (row by row) to 256, and unchecked indices.
  for (int page : {0, 1, 4, 16, 64, 256}) {
    const std::string p = page == 0 ? "contiguous" : "paged" + std::to_string(page);
    add(decode_case("wide_" + p + "_lengths_edges", page, 1, 1, {0, 1, 15, 16, 17, 63, 64, 65, 257}, 16, 8, 128));
  }
  add(decode_case("wide_paged16_hk16_gqa2", 16, 1, 1, {300, 17, 1000}, 32, 16, 128));
  add(decode_case("wide_paged16_spec4_rows16", 16, 4, 4, {300, 0, 700}, 32, 8, 128));
  add(decode_case("wide_limit_paged16_spec5_rows20", 16, 5, 5, {300, 0, 700}, 32, 8, 128));
  add(decode_case("wide_paged16_long_b1_split", 16, 1, 1, {5000}, 32, 8, 128));
  add(decode_case("wide_paged16_d64", 16, 2, 1, {300, 0, 1000}, 16, 8, 64));
  add(decode_case("wide_paged16_d256", 16, 1, 1, {300, 0, 1000}, 8, 4, 256));
  add(decode_case("wide_contiguous_d256_long_split", 0, 1, 0, {4000}, 8, 4, 256));
  s = decode_case("wide_paged64_long_window_softcap_alibi", 64, 1, 1, {3000, 40}, 16, 8, 128);
  s.options.window_left = 700;
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_head;
  add(s);
  s = decode_case("wide_paged16_unchecked_indices", 16, 2, 2, {3000, 0, 65}, 16, 8, 128);
  s.options.check_index_contents = false;
  add(s);
  for (CaseSpec& option_case : decode_option_cases()) add(std::move(option_case));
  return cases;
}

}  // namespace cuflash::test
