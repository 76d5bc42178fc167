// What the prefill and decode halves of `cuflash bench` share: a result row,
// JSON quoting and the row's timing fields, and (with CUDA) events, random
// inputs, finiteness checks, the workspace and L2-flush scratch, the warm-up
// + timed-calls loop and the loop over points and backends.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "bench_config.hpp"
#include "cuflash/status.hpp"
#include "device_buffers.hpp"

#ifdef CUFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cuflash::tool {

// What one (point, backend) gave: times, or the reason it has none.
struct BenchRow {
  BenchRow(const BenchPoint& point, Backend backend) : point(point), backend(backend) {}
  BenchPoint point;
  Backend backend;
  int reps = 0;
  double median_ms = 0.0, min_ms = 0.0, max_ms = 0.0;
  // Host wall time of the point's workspace queries and first call, up to GPU
  // idle: for a backend that builds something per shape (cudnn's graphs) the
  // build is in it.
  double first_call_ms = 0.0;
  // Median host time to launch one timed call (the per-call overhead the host pays).
  double host_us = 0.0;
  std::optional<std::string> error;
  // The point could not be set up here (too large for free memory): not a failure.
  bool skipped = false;

  double tflops() const { return point.flops() / (median_ms * 1e-3) / 1e12; }
  double gbps() const { return point.kv_bytes() / (median_ms * 1e-3) / 1e9; }
};

std::string json_string(const std::string& text);

// The fields every JSON row ends with: reps, the times, `rate_key` (tflops or
// gbps) = rate, first_call_ms, host_us and error (null where the row has no
// times); then the closing brace and newline, flushed.
void print_json_timing(const BenchRow& row, const char* rate_key, double rate);

#ifdef CUFLASH_WITH_CUDA

// Throws std::runtime_error naming the call.
void check_cuda(cudaError_t result, const char* what);

class Event {
 public:
  Event() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record() { check_cuda(cudaEventRecord(event_, nullptr), "cudaEventRecord"); }
  void synchronize() const { check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  double ms_since(const Event& start) const {
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, start.event_, event_), "cudaEventElapsedTime");
    return ms;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

// Holds the default stream while a timed call is queued: close() queues a
// host function that spins until the matching release(), so that the call's
// start event, kernels and stop event then run back to back on the GPU
// whatever the call costs to launch (the events would otherwise time the
// host where a call launches slower than it runs). Each hold waits for its
// own call's release only, so a host far ahead of the GPU never waits on it.
// A call that synchronizes the stream inside would wait for its hold, which
// waits for the call: a hold gives up after kMaxHold, and held_too_long()
// then says the gate is of no use for these calls (the caller stops closing
// it).
class StreamGate {
 public:
  static constexpr std::chrono::milliseconds kMaxHold{20};
  StreamGate() = default;
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  ~StreamGate();  // releases every hold and waits until the queued ones have returned
  void close();
  void release() { released_.fetch_add(1, std::memory_order_release); }
  bool held_too_long() const { return held_too_long_.load(std::memory_order_acquire); }

 private:
  struct Hold {
    StreamGate* gate;
    long long call;  // holds until `call` calls have been released
  };
  static void CUDART_CB hold(void* hold);
  std::deque<Hold> holds_;  // (a deque: the queued functions keep pointers to its elements)
  std::atomic<long long> released_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> held_too_long_{false};
};

// Standard normal values in the 16-bit dtype, drawn in parallel over fixed
// chunks (each with its own engine), so that a seed gives the same inputs on
// any number of cores.
std::vector<std::uint16_t> random_normal(std::size_t count, DType dtype, std::uint64_t seed);

bool finite_16(std::uint16_t bits, DType dtype);
// How many of the first `count` elements of a 16-bit (or f32) buffer are not finite.
std::size_t count_nonfinite(const Buffer& buffer, std::size_t count, DType dtype);
std::size_t count_nonfinite_f32(const Buffer& buffer, std::size_t count);

// Bytes of the buffer that flush_l2 overwrites: twice the L2 of device 0, at
// least 32 MiB; 0 without config.flush_l2.
std::size_t l2_flush_bytes(const BenchConfig& config);

// Scratch of every benchmark mode: a workspace that grows to the largest
// point's (never shrinks), and a buffer whose memset overwrites the L2 cache
// before each timed call, as triton.testing.do_bench does (allocated only
// when config.flush_l2).
class BenchScratch {
 public:
  explicit BenchScratch(const BenchConfig& config);
  void* workspace(std::size_t bytes);
  void flush_l2();

 private:
  Buffer workspace_, flush_;
  std::size_t workspace_bytes_ = 0, flush_bytes_ = 0;
};

// Warm-up, one call at a time (at least 3 calls and config.warmup_ms), which
// also estimates a call's time; then the timed calls, queued back to back,
// each between its own pair of events, `flush()` (overwriting the L2) before
// each, and each queued behind a StreamGate (so the events time the GPU,
// not the launch). Fills row's times, or row.error
// with the Status of a failed call.
template <typename Call, typename Flush>
void time_calls(const BenchConfig& config, std::deque<Event>& starts, std::deque<Event>& stops, Call call,
                Flush flush, BenchRow& row) {
  using Clock = std::chrono::steady_clock;
  auto fail = [&row](const Status& status) { row.error = status.to_string(); };
  double warm_ms = 0.0;
  int warm_calls = 0;
  while (warm_calls < 3 || warm_ms < config.warmup_ms) {
    flush();
    starts[0].record();
    if (Status status = call(); !status.ok()) return fail(status);
    stops[0].record();
    stops[0].synchronize();
    warm_ms += stops[0].ms_since(starts[0]);
    ++warm_calls;
  }
  const double call_ms = warm_ms / warm_calls;
  int reps = config.reps;
  if (reps == 0)
    reps = std::clamp(static_cast<int>(std::ceil(config.rep_ms / std::max(call_ms, 1e-3))), config.min_reps,
                      config.max_reps);
  while (static_cast<int>(starts.size()) < reps) {
    starts.emplace_back();
    stops.emplace_back();
  }
  std::vector<double> host_us(reps);
  StreamGate gate;
  for (int i = 0; i < reps; ++i) {
    flush();
    const bool gated = !gate.held_too_long();
    if (gated) gate.close();
    starts[i].record();
    const auto launch = Clock::now();
    const Status status = call();
    host_us[i] = std::chrono::duration<double, std::micro>(Clock::now() - launch).count();
    stops[i].record();
    if (gated) gate.release();
    if (!status.ok()) return fail(status);
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the timed calls");
  std::vector<double> times(reps);
  for (int i = 0; i < reps; ++i) times[i] = stops[i].ms_since(starts[i]);
  std::sort(times.begin(), times.end());
  row.reps = reps;
  row.median_ms = reps % 2 ? times[reps / 2] : 0.5 * (times[reps / 2 - 1] + times[reps / 2]);
  row.min_ms = times.front();
  row.max_ms = times.back();
  std::sort(host_us.begin(), host_us.end());
  row.host_us = reps % 2 ? host_us[reps / 2] : 0.5 * (host_us[reps / 2 - 1] + host_us[reps / 2]);
}

struct BenchTally {
  int failed = 0, skipped = 0;
};

// Every (point, backend) of the run, in order: measure(row) fills a row (a
// CUDA error it throws fails that row, and a sticky one every later row, each
// saying so), print(row) prints it as it comes. Counts failed and skipped rows.
template <typename Measure, typename Print>
BenchTally measure_all(const BenchConfig& config, const std::vector<BenchPoint>& points, Measure measure,
                       Print print) {
  BenchTally tally;
  for (const BenchPoint& point : points)
    for (Backend backend : config.backends) {
      BenchRow row(point, backend);
      try {
        measure(row);
      } catch (const std::exception& error) {
        row.error = error.what();
      }
      if (row.skipped) ++tally.skipped;
      else if (row.error) ++tally.failed;
      print(row);
    }
  return tally;
}

#endif  // CUFLASH_WITH_CUDA

}  // namespace cuflash::tool
