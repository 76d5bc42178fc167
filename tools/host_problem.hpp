// The problem `cuflash run` builds from its flags: random host inputs, output
// templates, and the per-sequence lengths; and the API arguments over any
// copy of those tensors (host or device).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuflash/attention.hpp"
#include "host_tensor.hpp"
#include "run_config.hpp"

namespace cuflash::tool {

// Every tensor of a call. Index tensors are int32, lse and alibi float32.
enum Slot : std::size_t {
  kQ, kK, kV, kKNew, kVNew, kOut, kLse, kAlibi,
  kCuSeqlensQ, kCuSeqlensK, kSeqlensK, kSeqlensKAfter, kBlockTable,
  kDout, kDq, kDk, kDv,
  kSlotCount
};
using Views = std::array<TensorView, kSlotCount>;

// The dtype and shape of one tensor; no dims: not given.
struct TensorShape {
  DType dtype = DType::f32;
  std::vector<std::int64_t> dims;
  // As a double: a product of flags can overflow any integer type.
  double elements() const;
  double bytes() const;
};
using ProblemShapes = std::array<TensorShape, kSlotCount>;

// Every tensor's shape, from the flags alone: nothing drawn or allocated, so
// that the memory a problem needs is known before it is built. Varlen packs
// total_q and total_k rows (the sums of the drawn lengths; the other layouts
// ignore them). build_problem() allocates exactly these.
ProblemShapes problem_shapes(const RunConfig& config, std::int64_t total_q, std::int64_t total_k);

// The per-sequence lengths, the first thing a seed draws (build_problem draws
// the same): two ints a sequence, so a varlen problem's totals are known
// before its tensors are allocated.
struct SequenceLengths {
  std::vector<int> q, kv;  // kv: cached + appended
  std::int64_t total_q() const;
  std::int64_t total_kv() const;
};
SequenceLengths draw_lengths(const RunConfig& config);

struct HostProblem {
  std::array<host::HostTensor, kSlotCount> tensors;
  // The KV cache once the forward has appended k_new/v_new (the backward's
  // input); equal to tensors[kK]/[kV] when nothing is appended.
  host::HostTensor k_after, v_after;
  std::vector<int> q_lens, kv_lens;  // per sequence; kv: cached + appended
  int max_q_len = 0, max_kv_len = 0;
  int max_pages = 0, num_pages = 0;

  double forward_flops = 0.0;  // 4*Hq*D*sum(Lq*Lk), halved when causal
  std::string describe_layout(const RunConfig& config) const;
};

HostProblem build_problem(const RunConfig& config);

Views host_views(const HostProblem& problem);
// Arguments over `views`. The backward attends over the cache after the
// append: views[kK]/[kV] must hold it, and seqlens come from kSeqlensKAfter.
ForwardArgs forward_args(const Views& views, const HostProblem& problem);
BackwardArgs backward_args(const Views& views, const HostProblem& problem);
AttentionOptions attention_options(const RunConfig& config, Backend backend);

}  // namespace cuflash::tool
