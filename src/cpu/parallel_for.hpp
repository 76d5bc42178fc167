// Runs independent work items on all cores. Items are claimed one at a time
// from an atomic counter, so uneven items (causal rows) balance themselves;
// results never depend on which thread ran an item.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace cuflash::detail::cpu {

// CUFLASH_NUM_THREADS overrides the core count (e.g. 1 for debugging).
inline int configured_thread_count() {
  if (const char* text = std::getenv("CUFLASH_NUM_THREADS")) {
    char* end = nullptr;
    const long requested = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && requested > 0) return static_cast<int>(std::min(requested, 1024L));
  }
  const unsigned cores = std::thread::hardware_concurrency();
  return cores == 0 ? 1 : static_cast<int>(cores);
}

// Threads a parallel_for over `item_count` items uses; callers size per-worker
// scratch with it before starting, so no allocation happens inside workers.
inline int worker_count(std::int64_t item_count) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(configured_thread_count(), item_count)));
}

// Calls body(item, worker) for every item in [0, item_count), worker in
// [0, worker_count(item_count)). The calling thread is worker 0. The first
// exception thrown by any item stops the claiming of new items and is
// rethrown here after every thread has joined.
template <typename Body>
void parallel_for(std::int64_t item_count, Body&& body) {
  if (item_count <= 0) return;
  const int workers = worker_count(item_count);
  std::atomic<std::int64_t> next_item{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;

  auto run_worker = [&](int worker) {
    try {
      for (;;) {
        const std::int64_t item = next_item.fetch_add(1, std::memory_order_relaxed);
        if (item >= item_count) return;
        body(item, worker);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next_item.store(item_count, std::memory_order_relaxed);
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(workers - 1));
  try {
    for (int worker = 1; worker < workers; ++worker) threads.emplace_back(run_worker, worker);
  } catch (...) {
    // Could not start a thread: the threads already started and this one
    // still finish every item.
  }
  run_worker(0);
  for (std::thread& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace cuflash::detail::cpu
