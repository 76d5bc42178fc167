#include "option_cases.hpp"

#include <utility>

namespace cuflash::test {

std::vector<CaseSpec> option_variant_cases() {
  std::vector<CaseSpec> cases;
  auto add = [&](CaseSpec s) { cases.push_back(std::move(s)); };
  const CaseSpec base = dense_case("", 37, 53, 4, 2, 64);
  add(variant(base, "window_8_4", [](CaseSpec& s) {
    s.options.window_left = 8;
    s.options.window_right = 4;
  }));
  add(variant(base, "window_left_16", [](CaseSpec& s) { s.options.window_left = 16; }));
  add(variant(base, "window_right_3", [](CaseSpec& s) { s.options.window_right = 3; }));
  add(variant(base, "window_0_0", [](CaseSpec& s) {
    s.options.window_left = 0;
    s.options.window_right = 0;
  }));
  CaseSpec s = dense_case("window_0_0_q_longer", 40, 25, 2, 1, 64);  // rows before the diagonal see nothing
  s.options.window_left = 0;
  s.options.window_right = 0;
  add(s);
  add(variant(base, "causal_window_left_10", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_left = 10;
  }));
  add(variant(base, "causal_overrides_window_right", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_right = 7;
  }));
  add(variant(base, "softcap_2", [](CaseSpec& s) { s.options.softcap = 2.0f; }));
  add(variant(base, "softcap_30_scale_1", [](CaseSpec& s) {
    s.options.softcap = 30.0f;
    s.options.softmax_scale = 1.0f;
  }));
  add(variant(base, "alibi_per_head", [](CaseSpec& s) { s.alibi = AlibiKind::per_head; }));
  add(variant(base, "alibi_per_batch", [](CaseSpec& s) { s.alibi = AlibiKind::per_batch; }));
  add(variant(base, "scale_0_3", [](CaseSpec& s) { s.options.softmax_scale = 0.3f; }));
  add(variant(base, "no_lse", [](CaseSpec& s) { s.with_lse = false; }));
  add(variant(base, "bhsd_strided", [](CaseSpec& s) { s.bhsd = true; }));
  add(variant(base, "padded_rows", [](CaseSpec& s) { s.row_padding = 5; }));
  s = dense_case("combined_causal_softcap_alibi_gqa8_bhsd", 37, 53, 8, 1, 64);
  s.options.causal = true;
  s.options.window_left = 20;
  s.options.softcap = 3.0f;
  s.alibi = AlibiKind::per_batch;
  s.bhsd = true;
  add(s);
  s = dense_case("combined_window_alibi_scale_padded", 53, 37, 4, 2, 96);
  s.options.window_left = 6;
  s.options.window_right = 9;
  s.options.softmax_scale = 0.2f;
  s.alibi = AlibiKind::per_head;
  s.row_padding = 3;
  add(s);
  // diagonal_offset (ring attention's blocks): the diagonal anywhere, rows
  // that see all, part or none of the keys.
  add(variant(base, "offset_causal_plus_30", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = 30;
  }));
  add(variant(base, "offset_causal_minus_20", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.diagonal_offset = -20;  // the first 20 rows see nothing
  }));
  add(variant(base, "offset_window_7_3_plus_60", [](CaseSpec& s) {
    s.options.window_left = 7;
    s.options.window_right = 3;
    s.options.diagonal_offset = 60;  // past the last key: the late rows see nothing
  }));
  add(variant(base, "offset_alibi_causal_window_plus_45", [](CaseSpec& s) {
    s.options.causal = true;
    s.options.window_left = 25;
    s.options.diagonal_offset = 45;
    s.alibi = AlibiKind::per_batch;
  }));
  add(variant(base, "offset_alibi_unmasked_plus_100", [](CaseSpec& s) {
    s.options.diagonal_offset = 100;  // nothing masked; ALiBi sees the distances
    s.alibi = AlibiKind::per_head;
  }));
  return cases;
}

// Windows and modifiers over several key tiles: B=2, Sq=300, Sk=1000, Hq=4, Hk=2, D=128.

}  // namespace cuflash::test
