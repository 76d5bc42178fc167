// The option cases every dense suite runs (no dtype yet; suites add theirs):
// one shape, B=2 Sq=37 Sk=53 Hq=4 Hk=2 D=64, with windows, causal with
// windows, softcap, ALiBi, scale, no lse, BHSD strides or padded rows, plus
// two shapes that combine several options.
#pragma once

#include <vector>

#include "attention_case.hpp"

namespace cuflash::test {

std::vector<CaseSpec> option_variant_cases();

}  // namespace cuflash::test
