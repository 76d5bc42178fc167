// merge_states: combines two partial attentions row by row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"
#include "parallel_for.hpp"
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

      const float lse_max = std::max(lse_a, lse_b);
      float lse = kNegInf;
      if (lse_max == kNegInf) {
        std::fill_n(row_a, dim, 0.0f);
      } else {
        // Weights relative to the larger lse, so neither exp overflows.
        const double weight_a = std::exp(static_cast<double>(lse_a) - lse_max);
        const double weight_b = std::exp(static_cast<double>(lse_b) - lse_max);
        const double total = weight_a + weight_b;
        lse = static_cast<float>(lse_max + std::log(total));
        const float share_a = static_cast<float>(weight_a / total);
        const float share_b = static_cast<float>(weight_b / total);
        for (int d = 0; d < dim; ++d) row_a[d] = share_a * row_a[d] + share_b * row_b[d];
      }
      store_row(problem.out, out_offset(problem.out, b, s, h), dim, row_a);
      store_f32(problem.lse, lse_offset(problem.lse, b, s, h), lse);
    }
  });
}

}  // namespace cuflash::detail::cpu
