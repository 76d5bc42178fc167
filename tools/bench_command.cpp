#include "bench_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuflash/cuflash.hpp"
#include "device_buffers.hpp"
#include "half_convert.hpp"

#ifdef CUFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cuflash::tool {
namespace {

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

  double tflops() const { return point.flops() / (median_ms * 1e-3) / 1e12; }
};

std::string json_string(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      quoted += escaped;
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

void print_json_row(const BenchRow& row, const BenchConfig& config, const std::string& device) {
  const BenchPoint& p = row.point;
  std::printf("{\"pass\": \"%s\", \"backend\": \"%s\", \"head_dim\": %d, \"heads\": %d, \"batch\": %d, "
              "\"seqlen\": %d, \"causal\": %s, \"dtype\": \"%s\", \"deterministic\": %s, \"device\": %s, "
              "\"flops\": %.6g, ",
              bench_pass_name(p.pass), backend_name(row.backend), p.head_dim, p.heads, p.batch, p.seqlen,
              p.causal ? "true" : "false", dtype_name(config.dtype), config.deterministic ? "true" : "false",
              json_string(device).c_str(), p.flops());
  if (row.error)
    std::printf("\"reps\": 0, \"median_ms\": null, \"min_ms\": null, \"max_ms\": null, \"tflops\": null, "
                "\"first_call_ms\": null, \"host_us\": null, \"error\": %s}\n",
                json_string(*row.error).c_str());
  else
    std::printf("\"reps\": %d, \"median_ms\": %.6g, \"min_ms\": %.6g, \"max_ms\": %.6g, \"tflops\": %.6g, "
                "\"first_call_ms\": %.6g, \"host_us\": %.6g, \"error\": null}\n",
                row.reps, row.median_ms, row.min_ms, row.max_ms, row.tflops(), row.first_call_ms, row.host_us);
  std::fflush(stdout);
}

void print_text_header() {
  std::printf("%-6s %4s %5s %5s %6s %-6s %-7s %10s %10s %10s %5s %8s %9s %8s\n", "pass", "D", "heads", "batch",
              "seqlen", "mask", "backend", "median ms", "min ms", "max ms", "reps", "TFLOP/s", "first ms", "host us");
}

void print_text_row(const BenchRow& row) {
  const BenchPoint& p = row.point;
  std::printf("%-6s %4d %5d %5d %6d %-6s %-7s ", bench_pass_name(p.pass), p.head_dim, p.heads, p.batch, p.seqlen,
              p.causal ? "causal" : "none", backend_name(row.backend));
  if (row.error)
    std::printf("failed: %s\n", row.error->c_str());
  else
    std::printf("%10.4f %10.4f %10.4f %5d %8.1f %9.2f %8.1f\n", row.median_ms, row.min_ms, row.max_ms, row.reps,
                row.tflops(), row.first_call_ms, row.host_us);
  std::fflush(stdout);
}

#ifdef CUFLASH_WITH_CUDA

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(result) + ": " +
                             cudaGetErrorString(result));
}

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

// Standard normal values in the 16-bit dtype, drawn in parallel over fixed
// chunks (each with its own engine), so that a seed gives the same inputs on
// any number of cores. 16k tokens x 2048 is 33.5M elements per tensor.
std::vector<std::uint16_t> random_normal(std::size_t count, DType dtype, std::uint64_t seed) {
  std::vector<std::uint16_t> values(count);
  constexpr std::size_t kChunk = 1 << 20;
  const std::size_t chunks = (count + kChunk - 1) / kChunk;
  const unsigned workers = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 64));
  std::vector<std::thread> threads;
  for (unsigned worker = 0; worker < workers; ++worker)
    threads.emplace_back([&, worker] {
      for (std::size_t chunk = worker; chunk < chunks; chunk += workers) {
        std::mt19937_64 engine(seed * 0x9e3779b97f4a7c15ull + chunk);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        const std::size_t end = std::min(count, (chunk + 1) * kChunk);
        for (std::size_t i = chunk * kChunk; i < end; ++i)
          values[i] = dtype == DType::bf16 ? detail::float_to_bf16(normal(engine)) : detail::float_to_f16(normal(engine));
      }
    });
  for (std::thread& thread : threads) thread.join();
  return values;
}

bool finite_16(std::uint16_t bits, DType dtype) {
  const std::uint16_t exponent_mask = dtype == DType::bf16 ? 0x7f80 : 0x7c00;
  return (bits & exponent_mask) != exponent_mask;
}

// Every buffer of the run, allocated once at the largest point's size: all
// prefill points hold the same 16k tokens x 2048 elements, so each point uses
// the same memory. One input set serves all timed calls: at that size a
// tensor is 64 MiB, more than the 50 MiB L2, and the L2 is overwritten before
// each timed call anyway.
class BenchMemory {
 public:
  BenchMemory(const BenchConfig& config, const std::vector<BenchPoint>& points) : dtype_(config.dtype) {
    std::size_t max_elements = 0, max_rows = 0;
    bool backward = false;
    for (const BenchPoint& p : points) {
      max_elements = std::max<std::size_t>(max_elements, std::size_t(p.batch) * p.seqlen * p.heads * p.head_dim);
      max_rows = std::max<std::size_t>(max_rows, std::size_t(p.batch) * p.heads * p.seqlen);
      backward = backward || p.pass == BenchPass::fwdbwd;
    }
    const std::size_t bytes = max_elements * dtype_size(dtype_);
    Buffer* inputs[] = {&q, &k, &v, &dout};
    for (std::uint64_t i = 0; i < (backward ? 4u : 3u); ++i) {
      Buffer* input = inputs[i];
      *input = Buffer::raw(Placement::cuda, bytes);
      const std::vector<std::uint16_t> values = random_normal(max_elements, dtype_, 4 * config.seed + i);
      check_cuda(cudaMemcpy(input->data(), values.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the GPU");
    }
    out = Buffer::raw(Placement::cuda, bytes);
    lse = Buffer::raw(Placement::cuda, max_rows * sizeof(float));
    if (backward)
      for (Buffer* gradient : {&dq, &dk, &dv}) *gradient = Buffer::raw(Placement::cuda, bytes);
    if (config.flush_l2) {
      int l2_bytes = 0;
      check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "cudaDeviceGetAttribute");
      flush_bytes_ = std::max<std::size_t>(2 * std::size_t(l2_bytes), 32u << 20);
      flush_ = Buffer::raw(Placement::cuda, flush_bytes_);
    }
  }

  TensorView view(const Buffer& buffer, const BenchPoint& p) const {
    return make_view(buffer.data(), dtype_, {p.batch, p.seqlen, p.heads, p.head_dim}, Device::cuda(0));
  }
  TensorView lse_view(const BenchPoint& p) const {
    return make_view(lse.data(), DType::f32, {p.batch, p.heads, p.seqlen}, Device::cuda(0));
  }

  // Grows, never shrinks: the scratch of the largest point so far.
  void* workspace(std::size_t bytes) {
    if (bytes > workspace_bytes_) {
      workspace_ = Buffer();
      workspace_ = Buffer::raw(Placement::cuda, bytes);
      workspace_bytes_ = bytes;
    }
    return workspace_.data();
  }

  // Overwrites the L2 cache, as triton.testing.do_bench does before each call.
  void flush_l2() {
    if (flush_bytes_ > 0) check_cuda(cudaMemsetAsync(flush_.data(), 0, flush_bytes_, nullptr), "cudaMemsetAsync");
  }

  Buffer q, k, v, dout, out, lse, dq, dk, dv;

 private:
  DType dtype_;
  Buffer workspace_, flush_;
  std::size_t workspace_bytes_ = 0, flush_bytes_ = 0;
};

// How many of the first `count` elements of a 16-bit buffer are not finite.
std::size_t count_nonfinite(const Buffer& buffer, std::size_t count, DType dtype) {
  std::vector<std::uint16_t> host(count);
  check_cuda(cudaMemcpy(host.data(), buffer.data(), count * 2, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
  return std::count_if(host.begin(), host.end(), [dtype](std::uint16_t bits) { return !finite_16(bits, dtype); });
}

std::size_t count_nonfinite_f32(const Buffer& buffer, std::size_t count) {
  std::vector<float> host(count);
  check_cuda(cudaMemcpy(host.data(), buffer.data(), count * 4, cudaMemcpyDeviceToHost), "cudaMemcpy from the GPU");
  return std::count_if(host.begin(), host.end(), [](float value) { return !std::isfinite(value); });
}

// Times one point on one backend into `row`; a failed Status ends it with row.error.
void measure(const BenchConfig& config, BenchMemory& memory, std::deque<Event>& starts, std::deque<Event>& stops,
             BenchRow& row) {
  const BenchPoint& p = row.point;
  const bool backward = p.pass == BenchPass::fwdbwd;
  AttentionOptions options;
  options.causal = p.causal;
  options.deterministic = config.deterministic;
  options.backend = row.backend;

  ForwardArgs forward;
  forward.q = memory.view(memory.q, p);
  forward.k = memory.view(memory.k, p);
  forward.v = memory.view(memory.v, p);
  forward.out = memory.view(memory.out, p);
  forward.lse = memory.lse_view(p);  // written in both passes, as training forwards (and SDPA's kernels) do
  BackwardArgs grad;
  if (backward) {
    grad.q = forward.q;
    grad.k = forward.k;
    grad.v = forward.v;
    grad.out = forward.out;
    grad.lse = forward.lse;
    grad.dout = memory.view(memory.dout, p);
    grad.dq = memory.view(memory.dq, p);
    grad.dk = memory.view(memory.dk, p);
    grad.dv = memory.view(memory.dv, p);
  }

  auto fail = [&row](const Status& status) { row.error = status.to_string(); };
  using Clock = std::chrono::steady_clock;
  // The workspace queries are part of a shape's first call: cudnn builds its graphs in the first of them.
  const auto query_start = Clock::now();
  std::size_t bytes = 0, backward_bytes = 0;
  if (Status status = forward_workspace_size(forward, options, &bytes); !status.ok()) return fail(status);
  if (backward) {
    if (Status status = backward_workspace_size(grad, options, &backward_bytes); !status.ok()) return fail(status);
    bytes = std::max(bytes, backward_bytes);
  }
  const double query_ms = std::chrono::duration<double, std::milli>(Clock::now() - query_start).count();
  const RunContext context{nullptr, memory.workspace(bytes), bytes};
  auto call = [&]() -> Status {
    CUFLASH_TRY(attention_forward(forward, options, context));
    if (backward) return attention_backward(grad, options, context);
    return {};
  };

  // One call over NaN-poisoned outputs: a point whose outputs are not all
  // finite afterwards is broken, not slow, and gets no time.
  const std::size_t elements = std::size_t(p.batch) * p.seqlen * p.heads * p.head_dim;
  const std::size_t rows = std::size_t(p.batch) * p.heads * p.seqlen;
  std::vector<std::pair<const char*, const Buffer*>> outputs = {{"out", &memory.out}};
  if (backward) outputs.insert(outputs.end(), {{"dq", &memory.dq}, {"dk", &memory.dk}, {"dv", &memory.dv}});
  for (const auto& [name, buffer] : outputs)
    check_cuda(cudaMemset(buffer->data(), 0xff, elements * dtype_size(config.dtype)), "cudaMemset");
  check_cuda(cudaMemset(memory.lse.data(), 0xff, rows * sizeof(float)), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the first call");
  const auto first_start = Clock::now();
  if (Status status = call(); !status.ok()) return fail(status);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the first call");
  row.first_call_ms = query_ms + std::chrono::duration<double, std::milli>(Clock::now() - first_start).count();
  std::string bad;
  for (const auto& [name, buffer] : outputs)
    if (const std::size_t n = count_nonfinite(*buffer, elements, config.dtype); n > 0)
      bad += std::string(bad.empty() ? "" : ", ") + name + " " + std::to_string(n) + " of " + std::to_string(elements);
  if (const std::size_t n = count_nonfinite_f32(memory.lse, rows); n > 0)
    bad += std::string(bad.empty() ? "" : ", ") + "lse " + std::to_string(n) + " of " + std::to_string(rows);
  if (!bad.empty()) {
    row.error = "outputs not finite after the call (" + bad + ")";
    return;
  }

  // Warm-up, one call at a time, which also estimates a call's time.
  double warm_ms = 0.0;
  int warm_calls = 0;
  while (warm_calls < 3 || warm_ms < config.warmup_ms) {
    memory.flush_l2();
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

  // Timed calls, queued back to back (the host stays ahead of the GPU), each
  // between its own pair of events, the L2 overwritten before each.
  std::vector<double> host_us(reps);
  for (int i = 0; i < reps; ++i) {
    memory.flush_l2();
    starts[i].record();
    const auto launch = Clock::now();
    if (Status status = call(); !status.ok()) return fail(status);
    host_us[i] = std::chrono::duration<double, std::micro>(Clock::now() - launch).count();
    stops[i].record();
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

#endif  // CUFLASH_WITH_CUDA

int bench_error(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "cuflash: bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int bench_command(const BenchConfig& config) {
#ifndef CUFLASH_WITH_CUDA
  (void)config;
  return bench_error("this cuflash was built without CUDA; the benchmark needs a CUDA GPU");
#else
  int devices = 0;
  if (const cudaError_t result = cudaGetDeviceCount(&devices); result != cudaSuccess)
    return bench_error(std::string("no CUDA GPU usable here (cudaGetDeviceCount: ") + cudaGetErrorName(result) +
                       ": " + cudaGetErrorString(result) + ")");
  if (devices == 0) return bench_error("no CUDA GPU visible");

  cudaDeviceProp properties{};
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  const std::string device = properties.name;
  const std::vector<BenchPoint> points = bench_points(config);

  BenchMemory memory(config, points);
  std::deque<Event> starts(1), stops(1);  // a deque: events neither copy nor move
  if (!config.json) {
    std::printf("cuflash %s bench: %s (sm_%d%d), %s, [B, S, H, D] inputs, random normal\n", version(), device.c_str(),
                properties.major, properties.minor, dtype_name(config.dtype));
    std::printf("timing: CUDA-event median per call after a %g ms warm-up%s; TFLOP/s = 4*B*H*S*S*D"
                " (/2 causal, x3.5 fwdbwd) / median\n",
                config.warmup_ms, config.flush_l2 ? ", L2 overwritten before each call" : "");
    std::printf("first ms: host wall time of the point's first call (cudnn builds its graphs then); host us: median"
                " host time to launch one call\n");
    print_text_header();
  }
  int failed = 0;
  for (const BenchPoint& point : points)
    for (Backend backend : config.backends) {
      BenchRow row(point, backend);
      try {
        measure(config, memory, starts, stops, row);
      } catch (const std::exception& error) {
        // A CUDA error; a sticky one fails every later point too, each saying so.
        row.error = error.what();
      }
      if (row.error) ++failed;
      if (config.json) print_json_row(row, config, device);
      else print_text_row(row);
    }
  if (failed > 0 && !config.json)
    std::printf("%d of %zu points failed\n", failed, points.size() * config.backends.size());
  return failed > 0 ? 1 : 0;
#endif
}

}  // namespace cuflash::tool
