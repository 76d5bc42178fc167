// A warp-uniform runtime flag turned into a compile-time one: f is called
// with std::true_type or std::false_type (both convert to bool in a plain
// `if`, which the compiler then folds), so that a loop whose body tests the
// flag per element is compiled twice, each version straight-line. Left as
// a runtime test, ptxas kept a branch and the skipped mask code inline
// around every element (the Hopper backward's exponentials: ~25 SASS
// instructions per element, 16 % of its stall samples waiting for
// instructions to be fetched; docs/perf/NOTES.md, session 22).
// Versioned = false calls f(flag) once, for kernels where a second copy
// costs more registers than the branches cost time.
#pragma once

#include <type_traits>

namespace cuflash::detail {

template <bool Versioned = true, class F>
__device__ __forceinline__ void bool_switch(bool flag, F&& f) {
  if constexpr (!Versioned) {
    f(flag);
  } else if (flag) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

}  // namespace cuflash::detail
