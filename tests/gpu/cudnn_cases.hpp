// What the cuDNN backend's suites expect of a case: whether backend=cudnn
// runs it, or the words of its `unsupported` answer (f32, head dims that are
// not multiples of 8 up to 256, softcap, ALiBi, varlen keys in pages, KV-cache
// backward, append, a leftpad, a rotary embedding and more than one query per
// sequence: src/cudnn/cudnn_support.cpp). And the KV-cache cases the GPU runs on top of
// the CPU suite's (kv_cache_cases.hpp): longer caches, prefill chunks, GQA,
// page sizes up to 256, all without an append.
#pragma once

#include <string>
#include <vector>

#include "common/kv_cache_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {

// Empty when backend=cudnn must run the case; else what its refusal must say.
inline std::vector<std::string> cudnn_refusal(const CaseSpec& s, TestPass pass) {
  const std::string backend = "backend cudnn";
  // (refuse_cpu_only_features: before any shape check)
  if (!s.leftpad.empty()) return {backend, "leftpad"};
  if (s.rotary_dim > 0) return {backend, "rotary"};
  if (s.dtype == DType::f32) return {backend, "dtype f32"};
  if (s.head_dim % 8 != 0 || s.head_dim > 256) return {backend, "head_dim " + std::to_string(s.head_dim)};
  if (s.options.softcap > 0.0f) return {backend, "softcap"};
  if (s.options.diagonal_offset) return {backend, "diagonal_offset"};
  if (s.alibi != AlibiKind::none) return {backend, "alibi"};
  if (s.layout == CaseLayout::varlen && s.page_size > 0) return {backend, "block_table"};
  if (s.layout == CaseLayout::kv_cache && pass == TestPass::backward) return {backend, "kv-cache", "backward"};
  if (s.layout == CaseLayout::kv_cache && s.new_len > 0) return {backend, "append"};
  // cuDNN reads cache slots past seqlens_k for q_len > 1 (the cases poison them with NaN).
  if (s.layout == CaseLayout::kv_cache && s.q_len > 1) return {backend, "more than one query per sequence"};
  return {};
}

// backend=cudnn on a case: it must match the oracle where cuDNN runs it (and
// leave varlen rows after the last sequence alone), else be refused with the
// words cudnn_refusal gives and nothing written.
inline void check_cudnn_case(const CaseSpec& spec, TestPass pass) {
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(spec, rng.engine());
  DeviceRunner runner(Backend::cudnn);
  const std::vector<std::string> refusal = cudnn_refusal(spec, pass);
  if (!refusal.empty()) {
    expect_refused(c, runner, pass, refusal, Backend::cudnn);
    return;
  }
  if (pass == TestPass::forward) {
    check_forward_gpu(c, runner);
    expect_unowned_out_rows_untouched(c);
  } else {
    check_backward_gpu(c, runner);
  }
}

inline std::vector<CaseSpec> gpu_kv_cache_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s = kv_cache_case("paged16_decode_long_mqa_d128", 16, 1, 0, {4097, 1000, 0, 63});
  s.heads_q = 8;
  s.heads_kv = 1;
  s.head_dim = 128;
  add(s);
  add(kv_cache_case("paged64_prefill65", 64, 65, 0, {300, 65, 1000}));
  s = kv_cache_case("paged256_prefill130_not_causal", 256, 130, 0, {1000, 0, 517});
  s.options.causal = false;
  add(s);
  s = kv_cache_case("contiguous_prefill65_d128", 0, 65, 0, {300, 65, 1000});
  s.head_dim = 128;
  add(s);
  add(kv_cache_case("paged16_q_longer_than_keys", 16, 9, 0, {3, 0, 1}));
  s = kv_cache_case("paged16_window_64", 16, 32, 0, {300, 20, 1000});
  s.options.window_left = 64;
  add(s);
  s = kv_cache_case("paged16_bhsd_padded", 16, 4, 0);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  s = kv_cache_case("paged16_shared_prefix_d256", 16, 2, 0, {37, 20, 70});
  s.share_first_page = true;
  s.head_dim = 256;
  add(s);
  s = kv_cache_case("paged1_decode_mqa_no_lse", 1, 1, 0, {100, 7, 0});
  s.heads_q = 8;
  s.heads_kv = 1;
  s.with_lse = false;
  add(s);
  return cases;
}

}  // namespace cuflash::test
