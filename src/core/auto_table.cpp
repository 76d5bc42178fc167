#include "auto_table.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

namespace cuflash::detail {

namespace {

constexpr AutoTableEntry kEntries[] = {
#include "auto_table_data.inc"
};

double log_distance(double a, double b) { return std::abs(std::log2(std::max(a, 1.0) / std::max(b, 1.0))); }

std::int64_t query_tokens(const Problem& p) {
  if (p.layout == Layout::varlen) return p.q.shape[0];
  return static_cast<std::int64_t>(p.batch) * p.max_q_len;
}

}  // namespace

const AutoTableEntry* auto_table(std::size_t* count) {
  *count = sizeof(kEntries) / sizeof(kEntries[0]);
  return kEntries;
}

Backend preferred_gpu_backend(const Problem& p) {
  std::size_t count = 0;
  const AutoTableEntry* entries = auto_table(&count);
  const bool causal = p.window_right == 0;
  const double seqlen = std::max(p.max_q_len, p.max_kv_len);
  const double tokens = static_cast<double>(query_tokens(p));
  bool same_dtype = false;
  for (std::size_t e = 0; e < count; ++e) same_dtype = same_dtype || (entries[e].pass == p.pass && entries[e].dtype == p.dtype);

  const AutoTableEntry* best = nullptr;
  // Ordered by importance: head dim, then mask, then size.
  double best_score[3] = {std::numeric_limits<double>::infinity(), 0, 0};
  for (std::size_t e = 0; e < count; ++e) {
    const AutoTableEntry& entry = entries[e];
    if (entry.pass != p.pass || (same_dtype && entry.dtype != p.dtype)) continue;
    const double score[3] = {static_cast<double>(std::abs(entry.head_dim - p.head_dim)),
                             entry.causal == causal ? 0.0 : 1.0,
                             log_distance(entry.seqlen, seqlen) + log_distance(entry.tokens, tokens)};
    if (best == nullptr || std::lexicographical_compare(score, score + 3, best_score, best_score + 3)) {
      best = &entry;
      std::copy(score, score + 3, best_score);
    }
  }
  return best != nullptr ? best->backend : Backend::cuda;
}

}  // namespace cuflash::detail
