#include "forward_matrix.hpp"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/option_cases.hpp"

namespace cuflash::test::forward_matrix {

// ----- head dims --------------------------------------------------------

std::vector<CaseSpec> head_dim_cases() {
  std::vector<CaseSpec> half, f32;
  for (int d : kTensorCoreHeadDims) {
    const std::string l = "d" + std::to_string(d);
    half.push_back(dense_case(l, 17, 40, 2, 1, d));  // the CPU suite's shape
    half.push_back(causal(dense_case(l + "_q65_k1000_causal", 65, 1000, 2, 1, d, 1)));
  }
  for (const std::vector<int>* dims : {&kNarrowHeadDims, &kPaddedHeadDims})
    for (int d : *dims) {
      const std::string l = "d" + std::to_string(d);
      half.push_back(dense_case(l, 17, 40, 2, 1, d));
      half.push_back(causal(dense_case(l + "_q65_k300_gqa_causal", 65, 300, 4, 2, d, 2)));
    }
  for (int d : {32, 40, 64, 80, 96, 128, 160, 192, 256})  // f32 (SIMT): any head dim
    f32.push_back(dense_case("d" + std::to_string(d), 17, 40, 2, 1, d));
  f32.push_back(causal(dense_case("d80_q65_k1000_causal", 65, 1000, 2, 1, 80, 1)));
  f32.push_back(causal(dense_case("d256_q65_k1000_causal", 65, 1000, 2, 1, 256, 1)));
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

// ----- lengths 1, 63, 65, 1000, 4097 -------------------------------------

std::vector<CaseSpec> length_cases() {
  std::vector<CaseSpec> half;
  for (auto [q, k] : std::vector<std::pair<int, int>>{{1, 1},
                                                      {1, 63},
                                                      {1, 65},
                                                      {1, 1000},
                                                      {63, 63},
                                                      {65, 65},
                                                      {63, 65},
                                                      {65, 63},
                                                      {17, 255},
                                                      {255, 17},
                                                      {65, 1000},
                                                      {1000, 65}})
    half.push_back(dense_case(qk_label(q, k), q, k, 2, 1, 64));
  // The CPU suite's other lengths.
  half.push_back(dense_case("q1_k255", 1, 255, 2, 1, 64));
  half.push_back(dense_case("q17_k17", 17, 17, 2, 1, 64));
  half.push_back(dense_case("q255_k255", 255, 255, 2, 1, 64, 1));
  half.push_back(dense_case("q1024_k1024", 1024, 1024, 1, 1, 64, 1));
  half.push_back(dense_case("q1000_k1000_d128", 1000, 1000, 2, 1, 128, 1));
  half.push_back(dense_case("q65_k4097_d128", 65, 4097, 2, 1, 128, 1));
  half.push_back(dense_case("q4097_k65", 4097, 65, 2, 1, 64, 1));
  std::vector<CaseSpec> cases = for_gpu_dtypes(half, kHalfDtypes);
  // The two largest: 4097 x 4097 keys for one head (the float64 oracle takes seconds).
  cases.push_back(dense_case("q4097_k4097_d128", 4097, 4097, 1, 1, 128, 1));
  cases.back().dtype = DType::bf16;
  cases.push_back(causal(dense_case("q4097_k4097_d128_causal", 4097, 4097, 1, 1, 128, 1)));
  cases.back().dtype = DType::f16;
  cases.push_back(causal(dense_case("q4097_k4097_d256_causal", 4097, 4097, 1, 1, 256, 1)));
  cases.back().dtype = DType::bf16;
  cases.push_back(dense_case("q4097_k4097_gqa2_d64_window_256_0", 4097, 4097, 2, 1, 64, 1));
  cases.back().options.window_left = 256;
  cases.back().options.window_right = 0;
  cases.back().dtype = DType::f16;
  return concat(cases, for_gpu_dtypes(
                           {
                               dense_case("q1_k1", 1, 1, 2, 1, 64),
                               dense_case("q63_k65", 63, 65, 2, 1, 64),
                               dense_case("q65_k63", 65, 63, 2, 1, 64),
                               dense_case("q1000_k1000", 1000, 1000, 1, 1, 64, 1),
                               dense_case("q1_k4097", 1, 4097, 2, 1, 128, 1),
                               causal(dense_case("q4097_k4097_causal", 4097, 4097, 1, 1, 64, 1)),
                           },
                           kF32));
}

// ----- GQA / MQA ----------------------------------------------------------

std::vector<CaseSpec> gqa_cases() {
  // The CPU suite's shapes, then GPU ones over one and several key tiles.
  std::vector<CaseSpec> half = {dense_case("gqa1_h2", 33, 47, 2, 2, 64), dense_case("gqa2_h4", 33, 47, 4, 2, 64),
                                dense_case("gqa8_h8", 33, 47, 8, 1, 64)};
  for (auto [hq, hk, name] : std::vector<std::tuple<int, int, const char*>>{
           {2, 2, "mha_h2"}, {4, 2, "gqa2_h4_k2"}, {6, 2, "gqa3_h6_k2"}, {8, 1, "mqa_h8_k1"}}) {
    half.push_back(dense_case(name, 65, 63, hq, hk, 64));
    half.push_back(causal(dense_case(std::string(name) + "_q63_k1000_causal_d128", 63, 1000, hq, hk, 128, 1)));
  }
  return concat(
      for_gpu_dtypes(half, kHalfDtypes),
      for_gpu_dtypes({dense_case("gqa3_h6_k2", 65, 63, 6, 2, 64), dense_case("mqa_h8_k1", 65, 63, 8, 1, 64)}, kF32));
}

// ----- causal: Sq = Sk, Sq < Sk, Sq > Sk ---------------------------------------

std::vector<CaseSpec> causal_cases() {
  std::vector<CaseSpec> half = {
      dense_case("causal_square_45", 45, 45, 4, 2, 64),
      dense_case("causal_square_1000_d128", 1000, 1000, 2, 1, 128, 1),
      dense_case("causal_q_shorter_17_255", 17, 255, 2, 1, 64),
      dense_case("causal_q_shorter_65_1000", 65, 1000, 2, 1, 64, 1),
      // Bottom-right alignment with more queries than keys: the first rows see nothing.
      dense_case("causal_q_longer_255_17", 255, 17, 2, 1, 64),
      dense_case("causal_q_longer_1000_65", 1000, 65, 2, 1, 96, 1),
      dense_case("causal_decode_1_255", 1, 255, 4, 1, 64),
      dense_case("causal_q1_k1", 1, 1, 2, 1, 64),
  };
  for (CaseSpec& s : half) s.options.causal = true;
  std::vector<CaseSpec> f32 = {
      dense_case("causal_square_65", 65, 65, 2, 1, 64),
      dense_case("causal_q_shorter_63_1000", 63, 1000, 2, 1, 64, 1),
      dense_case("causal_q_longer_1000_65", 1000, 65, 2, 1, 64, 1),
  };
  for (CaseSpec& s : f32) s.options.causal = true;
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

// ----- options: windows, softcap, ALiBi, scale, lse, strides -------------------

std::vector<CaseSpec> long_option_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  const CaseSpec base = dense_case("", 300, 1000, 4, 2, 128);
  add(variant(base, "long_window_left_100", [](CaseSpec& s) { s.options.window_left = 100; }));
  add(variant(base, "long_window_right_64", [](CaseSpec& s) { s.options.window_right = 64; }));
  add(variant(base, "long_window_200_50", [](CaseSpec& s) {
    s.options.window_left = 200;
    s.options.window_right = 50;
  }));
  add(variant(base, "long_causal_window_left_256", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_left = 256;
  }));
  // Sq > Sk with a window: leading rows see nothing, later ones a band.
  add(variant(base, "long_q_longer_window_64_0", [](CaseSpec& s) {
    s.q_len = 1000;
    s.kv_len = 300;
    s.batch = 1;
    s.options.window_left = 64;
    s.options.window_right = 0;
  }));
  add(variant(base, "long_softcap_5_causal", [](CaseSpec& s) {
    s.options.softcap = 5.0f;
    s.options.causal = true;
  }));
  add(variant(base, "long_alibi_per_head_causal", [](CaseSpec& s) {
    s.alibi = AlibiKind::per_head;
    s.options.causal = true;
  }));
  add(variant(base, "long_alibi_per_batch_window_softcap", [](CaseSpec& s) {
    s.alibi = AlibiKind::per_batch;
    s.options.window_left = 150;
    s.options.window_right = 30;
    s.options.softcap = 10.0f;
  }));
  add(variant(base, "long_bhsd_padded_no_lse", [](CaseSpec& s) {
    s.bhsd = true;
    s.row_padding = 8;
    s.with_lse = false;
  }));
  // diagonal_offset over several tiles (ring attention's blocks).
  add(variant(base, "long_offset_causal_plus_400", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = 400;
  }));
  add(variant(base, "long_offset_causal_minus_150", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = -150;
  }));
  add(variant(base, "long_offset_window_128_64_plus_800_alibi", [](CaseSpec& s) {
    s.options.window_left = 128;
    s.options.window_right = 64;
    s.options.diagonal_offset = 800;
    s.alibi = AlibiKind::per_head;
  }));
  add(variant(base, "long_scale_0_05_causal", [](CaseSpec& s) {
    s.options.softmax_scale = 0.05f;
    s.options.causal = true;
  }));
  return cases;
}

std::vector<CaseSpec> option_cases() {
  return concat(for_gpu_dtypes(concat(option_variant_cases(), long_option_cases()), kHalfDtypes),
                for_gpu_dtypes(option_variant_cases(), kF32));
}

// ----- varlen ------------------------------------------------------------

const std::vector<int> kSelfLens = {5, 0, 35, 1};
const std::vector<int> kCrossQ = {5, 0, 35, 7};  // sequence 3 has queries but no key
const std::vector<int> kCrossK = {12, 3, 20, 0};
const std::vector<int> kLongLens = {1, 63, 0, 65, 1000};
const std::vector<int> kLongCrossQ = {1000, 65, 1, 0, 63};
const std::vector<int> kLongCrossK = {63, 1000, 4097, 5, 0};

// The CPU suite's varlen cases; `head_dim_40` is 40 for f32 and 32 for the tensor cores.
std::vector<CaseSpec> cpu_varlen_cases(int head_dim_40) {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(varlen_case("self", kSelfLens, kSelfLens, 4, 2, 64));
  add(causal(varlen_case("self_causal", kSelfLens, kSelfLens, 4, 2, 64)));
  add(varlen_case("cross", kCrossQ, kCrossK, 4, 2, 64));
  add(causal(varlen_case("cross_causal", kCrossQ, kCrossK, 4, 2, 64)));
  s = varlen_case("cross_window_3_2", kCrossQ, kCrossK, 4, 2, 64);
  s.options.window_left = 3;
  s.options.window_right = 2;
  add(s);
  s = varlen_case("self_softcap_alibi_per_batch", kSelfLens, kSelfLens, 4, 2, 64);
  s.options.softcap = 2.0f;
  s.alibi = AlibiKind::per_batch;
  add(s);
  s = causal(varlen_case("self_alibi_per_head_causal", kSelfLens, kSelfLens, 4, 2, 64));
  s.alibi = AlibiKind::per_head;
  add(s);
  s = varlen_case("cross_gqa8_bhsd", kCrossQ, kCrossK, 8, 1, 64);
  s.bhsd = true;
  add(s);
  s = varlen_case("self_padded_scale_d" + std::to_string(head_dim_40), kSelfLens, kSelfLens, 2, 2, head_dim_40);
  s.row_padding = 7;
  s.options.softmax_scale = 0.4f;
  add(s);
  s = varlen_case("self_d256_no_lse", kSelfLens, kSelfLens, 2, 1, 256);
  s.with_lse = false;
  add(s);
  s = causal(varlen_case("long_mixed_causal", {1, 130, 0, 255}, {200, 130, 17, 255}, 2, 1, 128, 0));
  add(s);
  s = causal(varlen_case("cross_causal_offset_4_alibi", kCrossQ, kCrossK, 4, 2, 64));
  s.options.diagonal_offset = 4;  // the same offset in every sequence
  s.alibi = AlibiKind::per_head;
  add(s);
  return cases;
}

std::vector<CaseSpec> gpu_varlen_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(causal(varlen_case("long_self_causal_d128", kLongLens, kLongLens, 4, 2, 128)));
  add(varlen_case("long_self_d64", kLongLens, kLongLens, 4, 2, 64, 0));
  add(varlen_case("long_cross_mqa", kLongCrossQ, kLongCrossK, 4, 1, 64, 5));
  s = causal(varlen_case("long_cross_causal_window_50", kLongCrossQ, kLongCrossK, 4, 1, 64, 5));
  s.options.window_left = 50;
  add(s);
  // A decode batch: one query per sequence over very different key counts.
  add(causal(varlen_case("decode_batch_mqa_d128", {1, 1, 1, 1}, {4097, 0, 1000, 63}, 8, 1, 128, 2)));
  // The kernels must read cu_seqlens from device memory: the API checks nothing on the host.
  s = causal(varlen_case("long_self_causal_unchecked_indices", kLongLens, kLongLens, 4, 2, 64));
  s.options.check_index_contents = false;
  add(s);
  s = varlen_case("long_bhsd_padded_gqa3", {63, 65, 0, 1000}, {63, 65, 0, 1000}, 6, 2, 96);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  s = varlen_case("long_softcap_alibi_per_batch_window", kLongLens, kLongLens, 4, 2, 64);
  s.options.softcap = 4.0f;
  s.alibi = AlibiKind::per_batch;
  s.options.window_left = 70;
  s.options.window_right = 20;
  add(s);
  for (int d : {32, 192, 256})
    add(causal(varlen_case("d" + std::to_string(d) + "_causal", {1, 300, 0, 257}, {65, 300, 9, 257}, 2, 1, d)));
  return cases;
}

std::vector<CaseSpec> varlen_cases() {
  std::vector<CaseSpec> longest = {
      causal(varlen_case("long_4097_causal_d128", {4097, 1, 0, 1000}, {4097, 1, 0, 1000}, 2, 1, 128))};
  longest[0].dtype = DType::bf16;
  return concat(
      concat(longest, for_gpu_dtypes(concat(cpu_varlen_cases(32), gpu_varlen_cases()), kHalfDtypes)),
      for_gpu_dtypes(
          concat(cpu_varlen_cases(40),
                 {causal(varlen_case("long_self_causal_d128", kLongLens, kLongLens, 4, 2, 128)),
                  causal(varlen_case("decode_batch_mqa_d80", {1, 1, 1, 1}, {4097, 0, 1000, 63}, 8, 1, 80, 2))}),
          kF32));
}

// ----- Hopper's TMA kernel ------------------------------------------------
// The shapes that reach the warp-specialized TMA forward on an H100 beyond
// the lists above: D = 64 only takes it from 2048 keys on (tma_fwd_tile),
// so these give it D = 64 with long keys in every layout and option, the
// persistent walk (dense: more work items than SMs, ragged last blocks,
// causal items of unequal cost) and the per-item grid (window, varlen), GQA, strided
// views, and D = 192/256 varlen. On other GPUs they are ordinary cases.
std::vector<CaseSpec> tma_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(dense_case("tma_d64_q700_k2100_gqa", 700, 2100, 6, 2, 64, 2));
  add(causal(dense_case("tma_d64_q2100_k2100_causal", 2100, 2100, 2, 1, 64, 1)));
  s = dense_case("tma_d64_q300_k2500_window_softcap", 300, 2500, 3, 3, 64, 2);
  s.options.window_left = 700;
  s.options.window_right = 90;
  s.options.softcap = 8.0f;
  add(s);
  s = dense_case("tma_d64_q500_k2048_bhsd_padded_alibi", 500, 2048, 4, 2, 64, 2);
  s.bhsd = true;
  s.row_padding = 8;
  s.alibi = AlibiKind::per_head;
  add(s);
  add(dense_case("tma_d128_q1100_k1300_b3_mqa", 1100, 1300, 8, 1, 128, 3));
  // Causal dense calls walk their items dealt out by cost (tile_order.hpp):
  // more items than SMs, bottom-right with fewer and with more queries than
  // keys (leading blocks with no visible key), GQA.
  add(causal(dense_case("tma_d128_causal_walk_q1100_k1300_b3_gqa", 1100, 1300, 8, 2, 128, 3)));
  add(causal(dense_case("tma_d128_causal_walk_q1300_k1100_b2", 1300, 1100, 8, 8, 128, 2)));
  add(causal(dense_case("tma_d64_causal_walk_q2100_k2100_b4", 2100, 2100, 4, 4, 64, 4)));  // 11 blocks: an odd middle pair
  add(causal(dense_case("tma_d128_causal_walk_q1024_k1024_b5", 1024, 1024, 4, 4, 128, 5)));  // 8 blocks: even
  // D = 64's dense causal calls below 2048 keys: two consumers (three Q
  // buffers, four stages), walked in pairs (216 items; 9 blocks: an odd
  // middle pair), GQA.
  add(causal(dense_case("tma_d64_two_consumers_causal_walk_q1100_k1100_b3_gqa", 1100, 1100, 8, 2, 64, 3)));
  // D = 128 from 2048 keys: the deep ring (three stages, one Q buffer),
  // walked dense and causal, per item varlen, GQA, a strided view.
  add(dense_case("tma_d128_deep_q700_k2100_gqa", 700, 2100, 6, 2, 128, 2));
  add(causal(dense_case("tma_d128_deep_causal_walk_q2300_k2300_b2", 2300, 2300, 4, 2, 128, 2)));
  add(causal(varlen_case("tma_d128_deep_varlen_causal", {2100, 1, 0, 700}, {2100, 5, 0, 2300}, 2, 1, 128)));
  s = dense_case("tma_d128_deep_q300_k2500_bhsd_padded", 300, 2500, 4, 4, 128, 2);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  add(causal(varlen_case("tma_d64_varlen_causal", {2100, 1, 0, 700, 2300}, {2100, 5, 0, 2200, 2300}, 2, 1, 64)));
  add(varlen_case("tma_d192_varlen", {300, 1, 129}, {500, 2049, 64}, 2, 2, 192));
  add(causal(varlen_case("tma_d256_varlen_causal", {257, 64, 3}, {300, 64, 1000}, 2, 1, 256)));
  // A block whose second warpgroup has no rows (700 = 5 x 128 + 60) on a
  // one-Q-buffer kernel with TMA stores: that warpgroup walks the item idle
  // (pass_steps) while the other stages its O in the last K tile.
  add(dense_case("tma_d256_q700_k900_idle_warpgroup", 700, 900, 2, 1, 256, 2));
  // Narrower head dims on the next TMA kernel up (its box columns past them zero-filled).
  add(dense_case("tma_narrow_d40_q700_k2100_gqa", 700, 2100, 6, 2, 40, 2));
  s = dense_case("tma_narrow_d80_q300_k1300_bhsd_padded_softcap", 300, 1300, 4, 2, 80, 2);
  s.bhsd = true;
  s.row_padding = 8;
  s.options.softcap = 8.0f;
  add(s);
  add(causal(varlen_case("tma_narrow_d112_varlen_causal", {300, 1, 0, 129}, {500, 5, 0, 2049}, 2, 1, 112)));
  add(varlen_case("tma_narrow_d160_varlen", {300, 1, 129}, {500, 2049, 64}, 2, 2, 160));
  add(causal(dense_case("tma_narrow_d224_q257_k300", 257, 300, 2, 1, 224, 2)));
  // The narrower instantiations (sm90::tma_columns: 48 columns on the 64
  // kernel, 80 and 96 on the 128 one), plain and transformed scores, the
  // persistent walk and the per-item grid, and split-KV partials.
  s = dense_case("tma_columns80_d72_q700_k2100_alibi", 700, 2100, 4, 2, 72, 2);
  s.alibi = AlibiKind::per_head;
  add(s);
  add(dense_case("tma_columns80_d80_q1100_k1300_gqa", 1100, 1300, 8, 2, 80, 2));
  add(causal(varlen_case("tma_columns96_d88_varlen_causal", {300, 1, 0, 129}, {500, 5, 0, 2049}, 2, 1, 88)));
  add(varlen_case("tma_columns96_d96_varlen", {300, 1, 129}, {500, 2049, 64}, 4, 2, 96));
  add(causal(dense_case("tma_columns48_d48_q300_k2500", 300, 2500, 3, 3, 48, 2)));
  s = dense_case("tma_columns48_d40_q500_k2048_softcap", 500, 2048, 4, 2, 40, 1);
  s.options.softcap = 8.0f;
  add(s);
  add(dense_case("tma_columns80_splitkv_q1_k4097_d80", 1, 4097, 2, 1, 80, 1));
  add(dense_case("tma_columns48_splitkv_q2_k4097_d40", 2, 4097, 2, 1, 40, 1));
  // Scores of large magnitude (q and k with standard deviation 4: logits
  // of standard deviation ~16, ~23 in base 2), so that from tile to tile a
  // row's max rises both by more than the running max may lag
  // (online_softmax.cuh, kMaxLagLog2: raised, O rescaled) and by less
  // (kept: P up to 2^8, no rescale), on the TMA kernels (the deep
  // ring, D = 64's three consumers and its two for dense causal calls below
  // 2048 keys, D = 256's 80-key tiles, causal walked) and the cp.async
  // wgmma kernel (D = 64's varlen causal calls below 2048 keys).
  auto large_scores = [](CaseSpec c) {
    c.input_std = 4.0;
    return c;
  };
  add(large_scores(dense_case("large_scores_tma_d128_deep_q300_k2500", 300, 2500, 4, 2, 128, 2)));
  add(large_scores(causal(dense_case("large_scores_tma_d128_causal_q1100_k1300", 1100, 1300, 4, 4, 128, 2))));
  add(large_scores(dense_case("large_scores_tma_d64_q700_k2100", 700, 2100, 3, 1, 64, 2)));
  add(large_scores(causal(dense_case("large_scores_tma_d256_causal_q400_k700", 400, 700, 2, 1, 256, 2))));
  // (14 heads: 140 blocks of 64 rows, more than the SMs, so not the
  // split-keys rule below; 84 of 128 rows.)
  add(large_scores(causal(dense_case("large_scores_tma_d64_two_consumers_causal_q300_k1000", 300, 1000, 14, 14, 64, 2))));
  // (16 heads: 144 items of 128 rows, more than the SMs, so not the
  // two-consumer few-items rule.)
  add(large_scores(causal(varlen_case("large_scores_wgmma_d64_varlen_causal", {300, 1, 129}, {1000, 5, 300}, 16, 4, 64))));
  // D = 64 short keys without a mask on a grid of more than one wave (2
  // blocks x 8 heads x 9 = 144 items): TMA, whose third consumer has no rows
  // in a head's last block (300 = 192 + 108).
  add(large_scores(dense_case("large_scores_tma_d64_q300_k600_b9", 300, 600, 8, 2, 64, 9)));
  // D = 64's split-keys kernel: grids whose blocks of 64 rows fit one wave
  // (B x H x ceil(Sq / 64) <= 132) over 2-15 key tiles. Both consumers
  // compute a block's rows, consumer 0 its even key tiles (the first: the
  // causal diagonal's, at half width in even blocks), consumer 1 the odd
  // ones, merged in shared memory: 2, 3 (odd: consumer 0 one more) and 8
  // key tiles, ragged last blocks and key tiles, causal bottom-right with
  // fewer queries than keys and with more (blocks of one key tile, where
  // consumer 1 has none, and blocks with no visible key, where neither
  // has), GQA, varlen (per-thread stores; sequences of one key tile and of
  // none), a strided view, large scores.
  add(dense_case("tma_d64_split_keys_q512_k512_h16", 512, 512, 16, 16, 64, 1));
  add(causal(dense_case("tma_d64_split_keys_causal_q512_k512_h16", 512, 512, 16, 16, 64, 1)));
  add(dense_case("tma_d64_split_keys_q300_k333_gqa", 300, 333, 6, 2, 64, 2));
  add(causal(dense_case("tma_d64_split_keys_causal_q300_k1000", 300, 1000, 4, 4, 64, 2)));
  add(causal(dense_case("tma_d64_split_keys_causal_q700_k300", 700, 300, 2, 1, 64, 1)));
  add(causal(varlen_case("tma_d64_split_keys_varlen_causal", {300, 1, 0, 129}, {500, 5, 0, 1900}, 2, 1, 64)));
  add(varlen_case("tma_d64_split_keys_varlen", {300, 1, 129}, {500, 100, 1000}, 4, 2, 64));
  s = dense_case("tma_d64_split_keys_q200_k1900_bhsd_padded", 200, 1900, 4, 2, 64, 1);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  add(large_scores(causal(dense_case("large_scores_tma_d64_split_keys_causal_q256_k1000", 256, 1000, 4, 2, 64, 2))));
  // Windows on it: left and right bounds (an item's tiles t_lo .. t_hi, its
  // first ones unseen by the rows), a right bound alone, bottom-right
  // offsets.
  s = dense_case("tma_d64_split_keys_window_100_40_q777_k777", 777, 777, 2, 1, 64, 1);
  s.options.window_left = 100;
  s.options.window_right = 40;
  add(s);
  s = dense_case("tma_d64_split_keys_window_right_64_q300_k1000", 300, 1000, 4, 2, 64, 2);
  s.options.window_right = 64;
  add(s);
  s = dense_case("tma_d64_split_keys_window_50_10_q300_k900", 300, 900, 4, 4, 64, 2);
  s.options.window_left = 50;
  s.options.window_right = 10;
  add(s);
  // D = 128's split-keys kernel (64-key tiles in a ring of four stages,
  // below 1024 keys): 8, 6 and 5 key tiles, the same layouts.
  add(dense_case("tma_d128_split_keys_q512_k512_h16", 512, 512, 16, 16, 128, 1));
  add(causal(dense_case("tma_d128_split_keys_causal_q512_k512_h16", 512, 512, 16, 16, 128, 1)));
  add(dense_case("tma_d128_split_keys_q300_k333_gqa", 300, 333, 6, 2, 128, 2));
  add(causal(dense_case("tma_d128_split_keys_causal_q700_k300", 700, 300, 2, 1, 128, 1)));
  add(causal(varlen_case("tma_d128_split_keys_varlen_causal", {300, 1, 0, 129}, {500, 5, 0, 900}, 2, 1, 128)));
  add(large_scores(causal(dense_case("large_scores_tma_d128_split_keys_causal_q256_k1000", 256, 1000, 4, 2, 128, 2))));
  s = dense_case("tma_d128_split_keys_window_100_40_q600_k700", 600, 700, 2, 1, 128, 1);
  s.options.window_left = 100;
  s.options.window_right = 40;
  add(s);
  // A softmax_scale that is not positive takes the transformed variants
  // (attention_params.hpp, transformed_scores): uniform weights at 0, the
  // smallest scores weighing most when negative.
  auto scaled = [](CaseSpec c, float scale) {
    c.options.softmax_scale = scale;
    return c;
  };
  add(scaled(dense_case("scale_zero_tma_d128_deep_q300_k2500", 300, 2500, 4, 2, 128, 1), 0.0f));
  add(scaled(dense_case("scale_negative_tma_d64_q700_k2100", 700, 2100, 3, 1, 64, 1), -0.2f));
  add(scaled(causal(dense_case("scale_negative_tma_d256_causal_q400_k700", 400, 700, 2, 1, 256, 1)), -0.05f));
  add(scaled(causal(dense_case("scale_negative_wgmma_d64_causal_q300_k1000", 300, 1000, 2, 2, 64, 1)), -0.125f));
  return for_gpu_dtypes(cases, kHalfDtypes);
}

// ----- split-KV: few CTAs (batch x heads x query blocks) over long keys ------------

std::vector<CaseSpec> split_kv_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(dense_case("splitkv_q1_k4097_d128", 1, 4097, 2, 1, 128, 1));
  add(dense_case("splitkv_q1_k4097_d32", 1, 4097, 2, 1, 32, 1));
  add(dense_case("splitkv_q1_k4097_d192", 1, 4097, 2, 1, 192, 1));
  add(dense_case("splitkv_q1_k1025_h1", 1, 1025, 1, 1, 64, 1));  // just past the few-key-tiles threshold (16 tiles)
  add(causal(dense_case("splitkv_q16_k5000_causal_b2_h4", 16, 5000, 4, 4, 64)));
  add(causal(dense_case("splitkv_q16_k4097_causal_gqa3_d96", 16, 4097, 6, 2, 96, 1)));
  add(causal(dense_case("splitkv_q65_k4097_causal", 65, 4097, 1, 1, 128, 1)));
  s = dense_case("splitkv_q4_k8192_d256_window_alibi_mqa", 4, 8192, 8, 1, 256, 1);
  s.options.window_left = 3000;
  s.alibi = AlibiKind::per_head;
  add(s);
  s = dense_case("splitkv_q1_k4097_softcap_no_lse", 1, 4097, 2, 1, 128, 1);
  s.options.softcap = 3.0f;
  s.with_lse = false;
  add(s);
  // Most splits see no key of a row: their partial lse is -inf.
  s = dense_case("splitkv_q3_k4500_window_left_100", 3, 4500, 2, 1, 64, 1);
  s.options.window_left = 100;
  add(s);
  s = dense_case("splitkv_q2_k4097_alibi_per_batch", 2, 4097, 2, 2, 64);
  s.alibi = AlibiKind::per_batch;
  s.options.causal = true;
  add(s);
  s = dense_case("splitkv_q1_k4097_bhsd_padded", 1, 4097, 2, 1, 128, 1);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  // A short grid of whole query blocks (B=1, 16 heads, S=512: 64 CTAs on a
  // 132-SM H100) splits too, into thousands of rows of a few splits each:
  // the combine's warp-per-row kernel.
  add(dense_case("splitkv_prefill_s512_h16_d64", 512, 512, 16, 16, 64, 1));
  add(causal(dense_case("splitkv_prefill_s512_h16_d128_causal", 512, 512, 16, 16, 128, 1)));
  s = dense_case("splitkv_prefill_s700_gqa4_d64_window", 700, 700, 16, 4, 64, 1);
  s.options.window_left = 300;
  s.options.window_right = 20;
  add(s);
  return for_gpu_dtypes(cases, kHalfDtypes);
}

// ----- the compute-sanitizer subset: every forward kernel once, small shapes ----------

std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s, DType dtype) {
    s.dtype = dtype;
    cases.push_back(std::move(s));
  };
  CaseSpec s;
  // (On an H100 the first takes D = 64's split-keys kernel, 64-row blocks
  // over two key tiles; the second its two consumers walked in pairs, 144
  // blocks of 128 rows.)
  add(causal(dense_case("fwd_gqa_causal_d64", 65, 130, 4, 2, 64)), DType::bf16);
  add(causal(dense_case("fwd_two_consumers_causal_d64", 130, 130, 72, 72, 64, 1)), DType::f16);
  add(dense_case("fwd_d128", 63, 65, 2, 1, 128), DType::f16);
  // (D = 128's split-keys kernel: 64-row blocks over four 64-key tiles;
  // then D = 64's with a window, its first tiles unseen by the rows.)
  add(causal(dense_case("fwd_split_keys_causal_d128", 130, 200, 2, 1, 128, 1)), DType::bf16);
  s = dense_case("fwd_split_keys_window_d64", 150, 450, 2, 2, 64, 1);
  s.options.window_left = 100;
  s.options.window_right = 30;
  add(s, DType::f16);
  add(causal(dense_case("fwd_causal_d256", 65, 129, 2, 1, 256, 1)), DType::bf16);
  add(dense_case("fwd_d192_q_longer", 70, 33, 2, 1, 192, 1), DType::f16);
  s = dense_case("fwd_window_softcap_alibi_d32", 65, 100, 4, 2, 32);
  s.options.window_left = 16;
  s.options.window_right = 8;
  s.options.softcap = 5.0f;
  s.alibi = AlibiKind::per_batch;
  add(s, DType::f16);
  s = dense_case("fwd_bhsd_padded_d96", 40, 70, 2, 2, 96, 1);
  s.bhsd = true;
  s.row_padding = 8;
  add(s, DType::bf16);
  add(causal(varlen_case("fwd_varlen_causal", {5, 0, 70, 1}, {5, 0, 70, 1}, 4, 2, 64)), DType::bf16);
  add(varlen_case("fwd_varlen_cross_d128", kCrossQ, kCrossK, 4, 1, 128), DType::f16);
  add(dense_case("fwd_splitkv_q1_k4097", 1, 4097, 2, 1, 128, 1), DType::bf16);
  add(causal(dense_case("fwd_splitkv_q16_k4097_causal", 16, 4097, 2, 2, 64, 1)), DType::f16);
  add(causal(dense_case("fwd_f32_d64_causal", 17, 40, 2, 1, 64)), DType::f32);
  add(dense_case("fwd_f32_d80_gqa", 17, 40, 4, 2, 80), DType::f32);
  add(causal(varlen_case("fwd_f32_varlen_causal", kCrossQ, kCrossK, 4, 2, 256)), DType::f32);
  // Head dims between the kernels' (bounded columns, split too) and a padded one.
  add(causal(dense_case("fwd_narrow_d80_causal", 65, 129, 4, 2, 80, 1)), DType::bf16);
  add(dense_case("fwd_narrow_splitkv_d40_q1_k4097", 1, 4097, 2, 1, 40, 1), DType::f16);
  add(causal(varlen_case("fwd_padded_varlen_d59", {5, 0, 70, 1}, {5, 0, 70, 1}, 4, 2, 59)), DType::bf16);
  return cases;
}

}  // namespace cuflash::test::forward_matrix
