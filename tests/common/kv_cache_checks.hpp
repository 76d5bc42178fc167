// Checks on KV-cache calls that the case lists cannot express, shared by the
// CPU suite (which proves the checks themselves on the reference backend)
// and the GPU suites: the same logical cache in two layouts, and cache rows
// no sequence owns filled with a finite sentinel (a stray write of any value
// shows, where NaN poison cannot tell one NaN from another).
#pragma once

#include <cstdint>

#include "attention_case.hpp"

namespace cuflash::test {

// `to` takes the logical contents of `from` (same spec but for the cache's
// layout): q, every cached key and value (each into its page and slot),
// k_new/v_new and the ALiBi slopes.
void copy_logical_contents(const AttentionCase& from, AttentionCase& to);

// Elements of out and lse that differ (bitwise, as doubles) between two cases of one shape.
std::int64_t count_output_differences(const AttentionCase& a, const AttentionCase& b);

// Fills every cache row of k and v that holds no key and receives no
// appended key (guard pages, slack after each sequence) with `sentinel`;
// returns how many rows.
std::int64_t fill_unowned_cache_rows(AttentionCase& c, double sentinel);
// Elements of those rows (in k and v) that no longer equal `sentinel`.
std::int64_t count_unowned_cache_changes(const AttentionCase& c, double sentinel);

}  // namespace cuflash::test
