// The GPU backward test matrix, shared by the backends' suites: the CPU
// suite's dense and varlen cases plus head dims, lengths 1, 63, 65, 1000,
// 4097, GQA/MQA, windows, softcap, ALiBi and strided views. sanitize_cases():
// the compute-sanitizer subset; deterministic_cases(): shapes where many
// contributions meet in one gradient element (GQA, several key blocks).
#pragma once

#include <vector>

#include "gpu_cases.hpp"

namespace cuflash::test::backward_matrix {

std::vector<CaseSpec> dense_cases();
std::vector<CaseSpec> hopper_tma_cases();
std::vector<CaseSpec> head_dim_cases();
std::vector<CaseSpec> length_cases();
std::vector<CaseSpec> gqa_cases();
std::vector<CaseSpec> option_cases();
std::vector<CaseSpec> varlen_cases();
std::vector<CaseSpec> sanitize_cases();
std::vector<CaseSpec> deterministic_cases();
std::vector<CaseSpec> sanitize_deterministic_cases();

}  // namespace cuflash::test::backward_matrix
