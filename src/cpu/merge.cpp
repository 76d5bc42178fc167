// merge_states: combines two partial attentions row by row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"
#include "parallel_for.hpp"
#include "softmax_merge.hpp"
#include "tensor_access.hpp"

namespace cuflash::detail::cpu {
namespace {

std::int64_t out_offset(const TensorView& view, int b, int s, int h) {
  return b * view.strides[0] + s * view.strides[1] + h * view.strides[2];
}

std::int64_t lse_offset(const TensorView& view, int b, int s, int h) {
  return b * view.strides[0] + h * view.strides[1] + s * view.strides[2];
}

}  // namespace

void run_merge(const MergeProblem& problem) {
  const int dim = problem.head_dim;
  const std::int64_t positions = static_cast<std::int64_t>(problem.batch) * problem.seq_len;
  const int workers = worker_count(positions);
  // Per worker: row a, row b (merged in place into a).
  std::vector<std::vector<float>> rows(workers, std::vector<float>(2 * static_cast<std::size_t>(dim)));

  parallel_for(positions, [&](std::int64_t item, int worker) {
    const int b = static_cast<int>(item / problem.seq_len);
    const int s = static_cast<int>(item % problem.seq_len);
    float* row_a = rows[worker].data();
    float* row_b = row_a + dim;
    for (int h = 0; h < problem.heads; ++h) {
      // Everything of the row is read before anything is written: out and lse
      // may be out_a and lse_a themselves.
      const float lse_a = load_f32(problem.lse_a, lse_offset(problem.lse_a, b, s, h));
      const float lse_b = load_f32(problem.lse_b, lse_offset(problem.lse_b, b, s, h));
      load_row(problem.out_a, out_offset(problem.out_a, b, s, h), dim, row_a);
      load_row(problem.out_b, out_offset(problem.out_b, b, s, h), dim, row_b);

      // The shared rule (softmax_merge.hpp), in double here.
      const MergedLseOf<double> merged = merge_lse<double>(lse_a, lse_b);
      if (merged.lse == kNegInf) {
        std::fill_n(row_a, dim, 0.0f);  // (whatever the empty sides' rows hold)
      } else {
        const float share_a = static_cast<float>(merged.weight_a);
        const float share_b = static_cast<float>(merged.weight_b);
        for (int d = 0; d < dim; ++d) row_a[d] = share_a * row_a[d] + share_b * row_b[d];
      }
      store_row(problem.out, out_offset(problem.out, b, s, h), dim, row_a);
      store_f32(problem.lse, lse_offset(problem.lse, b, s, h), static_cast<float>(merged.lse));
    }
  });
}

}  // namespace cuflash::detail::cpu
