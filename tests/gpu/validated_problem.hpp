// The validated Problem of a host test case, for the plans' tests
// (forward_plan_test.cpp, backward_plan_test.cpp), which run without a GPU:
// the library's own validation of the case's arguments, so that a plan sees
// what a call would hand it. The case's host tensors die here; the plans read
// only shapes, strides and alignment.
#pragma once

#include <gtest/gtest.h>

#include <random>

#include "common/attention_case.hpp"
#include "problem.hpp"
#include "validate.hpp"

namespace cuflash::test {

inline detail::Problem validated_problem(const CaseSpec& spec, detail::Pass pass) {
  std::mt19937 engine(7);
  AttentionCase c(spec, engine);
  detail::Problem p;
  const AttentionOptions options = c.options(Backend::cuda);
  const Status status = pass == detail::Pass::forward
                            ? detail::validate_forward(c.forward_args(), options, nullptr, &p)
                            : detail::validate_backward(c.backward_args(), options, nullptr, &p);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return p;
}

}  // namespace cuflash::test
