#include "sm90/head_rows_tensor.hpp"

#include "problem.hpp"

namespace cuflash::detail::sm90 {

HeadRowsTensor head_rows_tensor(const Problem& problem, const TensorView& view, int heads) {
  HeadRowsTensor t;
  t.base = view.data;
  t.batch = problem.layout == Layout::varlen ? 1 : problem.batch;
  t.rows = view.shape[view.rank - 3];
  t.heads = heads;
  t.head_dim = problem.head_dim;
  t.strides = row_strides(view, problem.layout);
  return t;
}

}  // namespace cuflash::detail::sm90
