// The GPU forward test matrix, shared by the backends' suites (each
// instantiates the same lists): the CPU suite's cases (head dims, lengths,
// GQA, every option alone and combined, varlen with empty sequences and
// unowned packed rows) on the GPU's dtypes and head dims, plus lengths 1, 63,
// 65, 1000 and 4097 around the kernels' tile sizes, and split-KV shapes (few
// batch x head x query-block CTAs over thousands of keys). sanitize_cases():
// the small subset scripts/gpu-check.sh runs under compute-sanitizer.
#pragma once

#include <vector>

#include "gpu_cases.hpp"

namespace cuflash::test::forward_matrix {

std::vector<CaseSpec> head_dim_cases();
std::vector<CaseSpec> length_cases();
std::vector<CaseSpec> gqa_cases();
std::vector<CaseSpec> causal_cases();
std::vector<CaseSpec> option_cases();
std::vector<CaseSpec> varlen_cases();
std::vector<CaseSpec> split_kv_cases();
std::vector<CaseSpec> tma_cases();
std::vector<CaseSpec> sanitize_cases();

}  // namespace cuflash::test::forward_matrix
