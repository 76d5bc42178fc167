#include "kv_cache_checks.hpp"

#include <vector>

namespace cuflash::test {
namespace {

// Logical index of element `rest` (< Hk * D) of cache row (outer, pos).
std::int64_t cache_element(const HostTensor& cache, std::int64_t outer, std::int64_t pos, std::int64_t rest) {
  return (outer * cache.shape()[1] + pos) * cache.shape()[2] * cache.shape()[3] + rest;
}

std::int64_t row_elements(const AttentionCase& c) {
  return static_cast<std::int64_t>(c.spec().heads_kv) * c.spec().head_dim;
}

// Per cache row (outer * slots + pos): whether it holds or receives a key
// (a leftpad's rows do not).
std::vector<bool> owned_rows(const AttentionCase& c) {
  const std::int64_t slots = c.k.shape()[1];
  std::vector<bool> owned(static_cast<std::size_t>(c.k.shape()[0] * slots), false);
  for (int b = 0; b < c.batch(); ++b)
    for (int j = c.kv_first(b); j < c.kv_len(b); ++j) {
      const AttentionCase::CacheRow r = c.cache_row(b, j);
      owned[static_cast<std::size_t>(r.outer * slots + r.pos)] = true;
    }
  return owned;
}

void copy_all(const HostTensor& from, HostTensor& to) {
  for (std::int64_t i = 0; i < from.numel(); ++i) to.set(i, from.get(i));
}

}  // namespace

void copy_logical_contents(const AttentionCase& from, AttentionCase& to) {
  copy_all(from.q, to.q);
  copy_all(from.k_new, to.k_new);
  copy_all(from.v_new, to.v_new);
  copy_all(from.alibi, to.alibi);
  const std::int64_t row = row_elements(from);
  for (int b = 0; b < from.batch(); ++b)
    for (int j = 0; j < from.spec().cached_lens[b]; ++j) {
      const AttentionCase::CacheRow src = from.cache_row(b, j), dst = to.cache_row(b, j);
      for (std::int64_t e = 0; e < row; ++e) {
        to.k.set(cache_element(to.k, dst.outer, dst.pos, e), from.k.get(cache_element(from.k, src.outer, src.pos, e)));
        to.v.set(cache_element(to.v, dst.outer, dst.pos, e), from.v.get(cache_element(from.v, src.outer, src.pos, e)));
      }
    }
}

std::int64_t count_output_differences(const AttentionCase& a, const AttentionCase& b) {
  std::int64_t differ = 0;
  for (std::int64_t i = 0; i < a.out.numel(); ++i) differ += a.out.get(i) != b.out.get(i);
  for (std::int64_t i = 0; i < a.lse.numel(); ++i) differ += a.lse.get(i) != b.lse.get(i);
  return differ;
}

std::int64_t fill_unowned_cache_rows(AttentionCase& c, double sentinel) {
  const std::vector<bool> owned = owned_rows(c);
  const std::int64_t row = row_elements(c);
  std::int64_t filled = 0;
  for (std::size_t r = 0; r < owned.size(); ++r) {
    if (owned[r]) continue;
    ++filled;
    for (std::int64_t e = 0; e < row; ++e) {
      c.k.set(static_cast<std::int64_t>(r) * row + e, sentinel);
      c.v.set(static_cast<std::int64_t>(r) * row + e, sentinel);
    }
  }
  return filled;
}

std::int64_t count_unowned_cache_changes(const AttentionCase& c, double sentinel) {
  const std::vector<bool> owned = owned_rows(c);
  const std::int64_t row = row_elements(c);
  std::int64_t changed = 0;
  for (std::size_t r = 0; r < owned.size(); ++r) {
    if (owned[r]) continue;
    for (std::int64_t e = 0; e < row; ++e) {
      const std::int64_t i = static_cast<std::int64_t>(r) * row + e;
      changed += (c.k.get(i) != sentinel) + (c.v.get(i) != sentinel);
    }
  }
  return changed;
}

}  // namespace cuflash::test
