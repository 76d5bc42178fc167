// Case-building shorthands shared by the GPU suites (on top of
// tests/common/attention_case.hpp).
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_case.hpp"

namespace cuflash::test {

inline const std::vector<DType> kHalfDtypes = {DType::bf16, DType::f16};
inline const std::vector<DType> kF32 = {DType::f32};
// The head dims the fp16/bf16 tensor-core kernels are instantiated for ...
inline const std::vector<int> kTensorCoreHeadDims = {32, 64, 96, 128, 192, 256};
// ... multiples of 8 between them, run on the next kernel dim up with bounded
// columns (the first and last of each kernel's range, and the popular 40, 80, 160) ...
inline const std::vector<int> kNarrowHeadDims = {8, 24, 40, 72, 80, 104, 112, 136, 160, 200, 224, 248};
// ... and the others, run on copies padded to the next multiple of 8.
inline const std::vector<int> kPaddedHeadDims = {1, 3, 59, 111, 255};

// Page sizes backend cuda takes (KV caches and paged prefill): powers of two
// and multiples of 64; refused otherwise, naming kPageSizeRefusal.
inline bool cuda_takes_page_size(int page_size) {
  return (page_size & (page_size - 1)) == 0 || page_size % 64 == 0;
}
inline const char* const kPageSizeRefusal = "power of two or a multiple of 64";

// for_dtypes, except that for f16/bf16 a row padding becomes the next
// multiple of 8 elements: the tensor-core kernels need 16-byte rows (the CPU
// suite's odd paddings stay for f32; misaligned rows are tested on their own
// in attention_unsupported_gpu_test.cpp).
inline std::vector<CaseSpec> for_gpu_dtypes(const std::vector<CaseSpec>& specs, const std::vector<DType>& dtypes) {
  std::vector<CaseSpec> all = for_dtypes(specs, dtypes);
  for (CaseSpec& s : all)
    if (s.dtype != DType::f32 && s.row_padding % 8 != 0) s.row_padding = (s.row_padding / 8 + 1) * 8;
  return all;
}

inline std::vector<CaseSpec> concat(std::vector<CaseSpec> a, const std::vector<CaseSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline CaseSpec causal(CaseSpec s) {
  s.options.causal = true;
  return s;
}

inline CaseSpec relabel(CaseSpec s, std::string label) {
  s.label = std::move(label);
  return s;
}

// A packed batch; `extra_rows` packed rows after cu_seqlens[B] belong to no sequence.
inline CaseSpec varlen_case(std::string label, std::vector<int> q_lens, std::vector<int> kv_lens, int heads_q,
                            int heads_kv, int head_dim, int extra_rows = 3) {
  CaseSpec s;
  s.label = std::move(label);
  s.layout = CaseLayout::varlen;
  s.q_lens = std::move(q_lens);
  s.kv_lens = std::move(kv_lens);
  s.extra_rows = extra_rows;
  s.heads_q = heads_q;
  s.heads_kv = heads_kv;
  s.head_dim = head_dim;
  return s;
}

// A dtype as a test parameter, printed and named by its label.
struct DtypeParam {
  DType dtype;
};
inline void PrintTo(const DtypeParam& p, std::ostream* os) { *os << dtype_label(p.dtype); }
inline std::string dtype_param_name(const ::testing::TestParamInfo<DtypeParam>& info) {
  return dtype_label(info.param.dtype);
}
inline auto all_dtype_params() {
  return ::testing::Values(DtypeParam{DType::bf16}, DtypeParam{DType::f16}, DtypeParam{DType::f32});
}

// "q65_k1000" style labels.
inline std::string qk_label(int q_len, int kv_len) {
  return "q" + std::to_string(q_len) + "_k" + std::to_string(kv_len);
}

}  // namespace cuflash::test
