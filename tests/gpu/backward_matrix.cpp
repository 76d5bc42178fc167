#include "backward_matrix.hpp"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/kernel_table.hpp"

namespace cuflash::test::backward_matrix {

// 2 sequences, 4 query heads over 2 KV heads of dimension 64 unless said otherwise.
CaseSpec dense(std::string label, int q_len, int kv_len, int heads_q = 4, int heads_kv = 2, int head_dim = 64,
               int batch = 2) {
  return dense_case(std::move(label), q_len, kv_len, heads_q, heads_kv, head_dim, batch);
}

// ----- the CPU suite's dense cases ------------------------------------------------

std::vector<CaseSpec> cpu_dense_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  CaseSpec s;
  add(dense("plain", 33, 33));
  add(dense("q_shorter", 17, 70));
  add(causal(dense("causal", 33, 33)));
  add(causal(dense("causal_q_longer", 40, 17)));  // rows that see nothing: dq = 0 there
  add(causal(dense("causal_q_shorter", 17, 40)));
  const CaseSpec base = dense("", 33, 41);
  add(variant(base, "window_5_3", [](CaseSpec& s) {
    s.options.window_left = 5;
    s.options.window_right = 3;
  }));
  add(variant(base, "causal_window_left_7", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_left = 7;
  }));
  add(variant(base, "softcap_2", [](CaseSpec& s) { s.options.softcap = 2.0f; }));
  add(variant(base, "softcap_10_scale_0_5", [](CaseSpec& s) {
    s.options.softcap = 10.0f;
    s.options.softmax_scale = 0.5f;
  }));
  add(variant(base, "alibi_per_head", [](CaseSpec& s) { s.alibi = AlibiKind::per_head; }));
  add(variant(base, "alibi_per_batch_causal", [](CaseSpec& s) {
    s.alibi = AlibiKind::per_batch;
    s.options.causal = true;
  }));
  add(variant(base, "offset_causal_plus_12", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = 12;
  }));
  add(variant(base, "offset_causal_minus_9", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = -9;
  }));
  add(variant(base, "offset_window_4_2_alibi_plus_20", [](CaseSpec& s) {
    s.options.window_left = 4;
    s.options.window_right = 2;
    s.options.diagonal_offset = 20;
    s.alibi = AlibiKind::per_head;
  }));
  add(dense("gqa8", 25, 31, 8, 1));
  s = dense("bhsd", 25, 31);
  s.bhsd = true;
  add(s);
  s = causal(dense("combined_gqa8_causal_softcap_alibi_padded", 29, 37, 8, 1));
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_batch;
  s.row_padding = 3;
  add(s);
  return cases;
}

std::vector<CaseSpec> dense_cases() {
  std::vector<CaseSpec> f32;
  for (const CaseSpec& s : cpu_dense_cases())
    for (const char* keep : {"plain", "causal_q_longer", "window_5_3", "softcap_2", "alibi_per_batch_causal", "gqa8",
                             "bhsd", "combined_gqa8_causal_softcap_alibi_padded"})
      if (s.label == keep) f32.push_back(s);
  return concat(for_gpu_dtypes(cpu_dense_cases(), kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

// ----- the Hopper TMA backward's head dims --------------------------------------
// At each head dim of the kernel table's TMA backward: the CPU suite's dense
// cases (masks, windows, offsets, softcap, ALiBi, GQA, strided views, rows
// that see nothing), longer ones
// (several key blocks, query tiles past the sequence's end) and varlen. On an
// H100 the plan runs them on the TMA kernel; elsewhere on the sm80 kernels.

std::vector<CaseSpec> hopper_tma_cases() {
  std::vector<CaseSpec> half;
  for (int d : detail::kernel_table::kTmaBackwardHeadDims) {
    const std::string l = "d" + std::to_string(d) + "_";
    // At 64 (the default head dim) the dense suite above runs these already.
    if (d != 64)
      for (CaseSpec s : cpu_dense_cases()) {
        s.label = l + s.label;
        s.head_dim = d;
        half.push_back(std::move(s));
      }
    half.push_back(dense(l + "q300_k700_gqa", 300, 700, 4, 2, d, 1));
    half.push_back(causal(dense(l + "q700_k300_causal", 700, 300, 2, 2, d, 1)));
    half.push_back(causal(dense(l + "q1000_k1000_causal_mqa", 1000, 1000, 4, 1, d, 1)));
    CaseSpec window = dense(l + "q777_k777_window_100_40", 777, 777, 2, 1, d, 1);
    window.options.window_left = 100;
    window.options.window_right = 40;
    half.push_back(window);
    // Varlen: tails of key blocks and query tiles inside the packed rows (the
    // next sequence's rows, and NaN rows after cu_seqlens[B]), an empty
    // sequence, one without keys.
    half.push_back(causal(varlen_case(l + "varlen_causal_gqa", {5, 0, 135, 70}, {12, 3, 200, 64}, 4, 2, d)));
    CaseSpec varlen = varlen_case(l + "varlen_window_softcap_mqa", {63, 65, 0, 300}, {100, 65, 7, 300}, 4, 1, d);
    varlen.options.window_left = 50;
    varlen.options.window_right = 10;
    varlen.options.softcap = 2.0f;
    half.push_back(varlen);
  }
  return for_gpu_dtypes(half, kHalfDtypes);
}

// ----- head dims ------------------------------------------------------------------

std::vector<CaseSpec> head_dim_cases() {
  std::vector<CaseSpec> half, f32;
  for (int d : kTensorCoreHeadDims) {
    const std::string l = "d" + std::to_string(d);
    half.push_back(dense(l, 13, 19, 2, 1, d));  // the CPU suite's shape
    half.push_back(causal(dense(l + "_q65_k300_causal", 65, 300, 2, 1, d, 1)));
  }
  for (const std::vector<int>* dims : {&kNarrowHeadDims, &kPaddedHeadDims})
    for (int d : *dims) {
      const std::string l = "d" + std::to_string(d);
      half.push_back(dense(l, 13, 19, 2, 1, d));
      half.push_back(causal(dense(l + "_q65_k300_gqa_causal", 65, 300, 4, 2, d, 1)));
    }
  for (int d : {32, 40, 64, 80, 128, 160, 256}) f32.push_back(dense("d" + std::to_string(d), 13, 19, 2, 1, d));
  return concat(for_gpu_dtypes(half, kHalfDtypes), for_gpu_dtypes(f32, kF32));
}

// ----- lengths 1, 63, 65, 1000, 4097 -----------------------------------------------
// (Not kv_len 1: then dq = dk = 0 exactly, by cancellation, and a relative error means nothing.)

std::vector<CaseSpec> length_cases() {
  std::vector<CaseSpec> half = {
      dense("q1_k63", 1, 63, 2, 1),
      dense("q1_k4097_d128", 1, 4097, 2, 1, 128, 1),
      dense("q63_k65", 63, 65, 2, 1),
      dense("q65_k63", 65, 63, 2, 1),
      dense("q255_k2", 255, 2, 2, 1),
      dense("q1_k255", 1, 255, 2, 1),
      dense("q1024_k1024", 1024, 1024, 1, 1, 64, 1),
      dense("q63_k1000", 63, 1000, 2, 1, 64, 1),
      dense("q1000_k63", 1000, 63, 2, 1, 64, 1),
      causal(dense("q255_k255_causal", 255, 255, 1, 1, 64, 1)),
      causal(dense("q1000_k1000_causal_d128", 1000, 1000, 2, 1, 128, 1)),
      dense("q65_k4097_d128", 65, 4097, 2, 1, 128, 1),
      causal(dense("q4097_k65_causal", 4097, 65, 1, 1, 64, 1)),  // 4032 rows see nothing
  };
  std::vector<CaseSpec> cases = for_gpu_dtypes(half, kHalfDtypes);
  // The largest: 4097 x 4097 for one head (the float64 backward oracle takes seconds).
  cases.push_back(causal(dense("q4097_k4097_causal", 4097, 4097, 1, 1, 64, 1)));
  cases.back().dtype = DType::bf16;
  cases.push_back(causal(dense("q4097_k4097_causal_d128", 4097, 4097, 1, 1, 128, 1)));
  cases.back().dtype = DType::f16;
  cases.push_back(causal(dense("q4097_k4097_causal_window_256_d128", 4097, 4097, 1, 1, 128, 1)));
  cases.back().options.window_left = 256;
  cases.back().dtype = DType::bf16;
  for (DType dtype : kHalfDtypes) {
    cases.push_back(causal(dense("q1000_k1000_causal_d256", 1000, 1000, 1, 1, 256, 1)));
    cases.back().dtype = dtype;
  }
  return concat(cases, for_gpu_dtypes({dense("q1_k63", 1, 63, 2, 1), dense("q63_k65", 63, 65, 2, 1),
                                       causal(dense("q255_k255_causal", 255, 255, 1, 1, 64, 1)),
                                       causal(dense("q1000_k1000_causal", 1000, 1000, 1, 1, 64, 1))},
                                      kF32));
}

// ----- GQA / MQA ---------------------------------------------------------------

std::vector<CaseSpec> gqa_cases() {
  std::vector<CaseSpec> half;
  for (auto [hq, hk, name] : std::vector<std::tuple<int, int, const char*>>{
           {4, 2, "gqa2_h4_k2"}, {6, 2, "gqa3_h6_k2"}, {4, 1, "mqa_h4_k1"}, {8, 1, "mqa_h8_k1"}}) {
    half.push_back(dense(name, 63, 65, hq, hk));
    half.push_back(causal(dense(std::string(name) + "_q65_k300_causal_d128", 65, 300, hq, hk, 128, 1)));
  }
  return concat(for_gpu_dtypes(half, kHalfDtypes),
                for_gpu_dtypes({dense("gqa3_h6_k2", 63, 65, 6, 2), dense("mqa_h8_k1", 63, 65, 8, 1)}, kF32));
}

// ----- windows, softcap, ALiBi, strides over several tiles: B=2, Sq=129, Sk=200 ----------

std::vector<CaseSpec> option_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  const CaseSpec base = dense("", 129, 200, 4, 2, 64);
  add(variant(base, "window_left_32", [](CaseSpec& s) { s.options.window_left = 32; }));
  add(variant(base, "window_right_16", [](CaseSpec& s) { s.options.window_right = 16; }));
  add(variant(base, "window_40_24", [](CaseSpec& s) {
    s.options.window_left = 40;
    s.options.window_right = 24;
  }));
  add(variant(base, "causal_window_left_64", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_left = 64;
  }));
  // (Not window (0, 0): every query would see one key, and dq = dk = 0 by cancellation.)
  add(variant(base, "window_1_0_q_longer", [](CaseSpec& s) {
    s.q_len = 200;
    s.kv_len = 129;
    s.options.window_left = 1;
    s.options.window_right = 0;
  }));
  add(variant(base, "softcap_5", [](CaseSpec& s) { s.options.softcap = 5.0f; }));
  add(variant(base, "softcap_2_causal_d128", [](CaseSpec& s) {
    s.options.softcap = 2.0f;
    s.options.causal = true;
    s.head_dim = 128;
  }));
  add(variant(base, "alibi_per_head", [](CaseSpec& s) { s.alibi = AlibiKind::per_head; }));
  add(variant(base, "alibi_per_batch_causal", [](CaseSpec& s) {
    s.alibi = AlibiKind::per_batch;
    s.options.causal = true;
  }));
  add(variant(base, "bhsd_padded", [](CaseSpec& s) {
    s.bhsd = true;
    s.row_padding = 8;
  }));
  add(variant(base, "scale_0_3", [](CaseSpec& s) { s.options.softmax_scale = 0.3f; }));
  return for_gpu_dtypes(cases, kHalfDtypes);
}

// ----- varlen ----------------------------------------------------------------------

// Query lengths 1, 63, 0, 65, 1000. (No sequence of one query over one key:
// with GQA its dv is a sum of the group's dout rows that can cancel to an exact
// 0, which check_backward would take for "no query sees this key" while dk
// there is 0 only up to rounding.)
const std::vector<int> kLongQ = {1, 63, 0, 65, 1000};
const std::vector<int> kLongK = {7, 63, 0, 65, 1000};

std::vector<CaseSpec> varlen_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  // The CPU suite's: an empty sequence, a query sequence with no keys, and
  // packed rows after cu_seqlens[B] (their dq, dk, dv must be written as 0).
  add(causal(varlen_case("varlen_causal", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 64)));
  CaseSpec s = varlen_case("varlen_window_softcap_gqa", {5, 0, 35, 7}, {12, 3, 20, 0}, 8, 1, 64);
  s.options.window_left = 4;
  s.options.window_right = 6;
  s.options.softcap = 2.0f;
  add(s);
  add(causal(varlen_case("long_causal_d128", kLongQ, kLongK, 4, 2, 128)));
  const std::vector<CaseSpec> f32 = cases;
  add(varlen_case("long_cross_mqa", {1000, 65, 1, 0, 63}, {63, 1000, 4097, 5, 0}, 4, 1, 64, 5));
  s = causal(varlen_case("long_causal_unchecked_indices", kLongQ, kLongK, 4, 2, 64));
  s.options.check_index_contents = false;
  add(s);
  s = varlen_case("bhsd_padded_gqa3", {63, 65, 0, 300}, {63, 65, 0, 300}, 6, 2, 96);
  s.bhsd = true;
  s.row_padding = 8;
  add(s);
  s = varlen_case("alibi_per_batch_window", {63, 65, 0, 300}, {100, 65, 7, 300}, 4, 2, 64);
  s.alibi = AlibiKind::per_batch;
  s.options.window_left = 50;
  s.options.window_right = 10;
  add(s);
  for (int d : {32, 256})
    add(causal(varlen_case("d" + std::to_string(d) + "_causal", {1, 130, 0, 65}, {65, 130, 9, 65}, 2, 1, d)));
  std::vector<CaseSpec> all = concat(for_gpu_dtypes(cases, kHalfDtypes), for_gpu_dtypes(f32, kF32));
  all.push_back(causal(varlen_case("long_4097_causal_gqa2", {4097, 65, 0, 1}, {4097, 65, 3, 70}, 2, 1, 64)));
  all.back().dtype = DType::bf16;
  return all;
}

// The compute-sanitizer subset: each backward kernel (atomic dq) once, small shapes.
std::vector<CaseSpec> sanitize_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s, DType dtype) {
    s.dtype = dtype;
    cases.push_back(std::move(s));
  };
  add(causal(dense("bwd_gqa_causal_d64", 65, 130, 4, 2, 64, 1)), DType::bf16);
  add(dense("bwd_d128", 63, 65, 2, 1, 128, 1), DType::f16);
  add(dense("bwd_d256", 33, 65, 2, 1, 256, 1), DType::bf16);
  CaseSpec s = dense("bwd_window_softcap_alibi_d96_padded", 40, 70, 2, 2, 96, 1);
  s.options.window_left = 16;
  s.options.window_right = 8;
  s.options.softcap = 5.0f;
  s.alibi = AlibiKind::per_head;
  s.row_padding = 8;
  add(s, DType::f16);
  add(causal(varlen_case("bwd_varlen_causal_d32", {5, 0, 70, 7}, {12, 3, 70, 0}, 4, 2, 32)), DType::bf16);
  s = dense("bwd_d192_bhsd", 30, 40, 2, 1, 192, 1);
  s.bhsd = true;
  add(s, DType::f16);
  add(causal(dense("bwd_f32_d64_causal", 17, 40, 4, 2, 64)), DType::f32);
  add(varlen_case("bwd_f32_varlen_d80", {5, 0, 35, 7}, {12, 3, 20, 0}, 4, 2, 80), DType::f32);
  add(causal(dense("bwd_narrow_d80_causal", 65, 130, 4, 2, 80, 1)), DType::bf16);
  add(causal(varlen_case("bwd_padded_varlen_d59", {5, 0, 70, 7}, {12, 3, 70, 0}, 4, 2, 59)), DType::f16);
  return cases;
}

std::vector<CaseSpec> deterministic_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s, DType dtype) {
    s.dtype = dtype;
    cases.push_back(std::move(s));
  };
  add(causal(dense("s1000_gqa4_causal_d64", 1000, 1000, 4, 1, 64, 1)), DType::bf16);
  add(causal(dense("s1000_gqa4_causal_d128", 1000, 1000, 4, 1, 128, 1)), DType::bf16);
  add(dense("s1000_gqa4_d128", 1000, 1000, 4, 1, 128, 1), DType::f16);
  add(causal(varlen_case("varlen_gqa4_causal", {5, 0, 300, 65}, {5, 0, 300, 65}, 4, 1, 64)), DType::f16);
  add(causal(dense("s300_gqa4_causal_d64", 300, 300, 4, 1, 64, 1)), DType::f32);
  // Windows: the key blocks that add into a query tile start past block 0
  // (the Hopper kernel's turn order counts them); several batches.
  CaseSpec window = dense("s1000_gqa2_window_300_40_d128", 1000, 1000, 4, 2, 128, 2);
  window.options.window_left = 300;
  window.options.window_right = 40;
  add(window, DType::bf16);
  CaseSpec varlen = causal(varlen_case("varlen_gqa2_causal_window_d128", {700, 3, 0, 520}, {900, 3, 0, 260}, 4, 2, 128));
  varlen.options.window_left = 200;
  add(varlen, DType::bf16);
  // D = 256 (the wide kernel on Hopper: a turn per column half of a tile).
  add(causal(dense("s1000_gqa4_causal_d256", 1000, 1000, 4, 1, 256, 1)), DType::bf16);
  add(dense("s1000_gqa2_d256", 1000, 1000, 4, 2, 256, 1), DType::f16);
  CaseSpec wide = causal(varlen_case("varlen_gqa2_causal_window_d256", {700, 3, 0, 520}, {900, 3, 0, 260}, 4, 2, 256));
  wide.options.window_left = 200;
  add(wide, DType::bf16);
  // Without a right bound, several chains (batch x kv head): the Hopper
  // kernel launches their key blocks interleaved (sm90/bwd_chain_order.hpp);
  // varlen with empty and short sequences, and a left window (ascending
  // turns, walks starting past tile 0).
  add(dense("s700_b3_gqa2_d64", 700, 700, 4, 2, 64, 3), DType::bf16);
  add(dense("s500x600_b2_gqa2_d256", 500, 600, 4, 2, 256, 2), DType::bf16);
  add(varlen_case("varlen_gqa2_d128", {700, 3, 0, 520}, {900, 3, 0, 260}, 4, 2, 128), DType::f16);
  CaseSpec left = varlen_case("varlen_gqa2_window_left_d256", {700, 3, 0, 520}, {900, 3, 0, 260}, 4, 2, 256);
  left.options.window_left = 150;
  add(left, DType::bf16);
  return cases;
}

std::vector<CaseSpec> sanitize_deterministic_cases() {
  std::vector<CaseSpec> cases = {causal(dense("det_s300_gqa4_causal_d64", 300, 300, 4, 1, 64, 1)),
                                 dense("det_s200_gqa2_d128", 200, 200, 4, 2, 128, 1),
                                 causal(dense("det_s200_gqa2_causal_d256", 200, 200, 4, 2, 256, 1))};
  cases[0].dtype = DType::bf16;
  cases[1].dtype = DType::f16;
  cases[2].dtype = DType::bf16;
  return cases;
}

}  // namespace cuflash::test::backward_matrix
