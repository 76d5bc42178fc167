#include "bench_command.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "cuflash/cuflash.hpp"
#include "bench_decode.hpp"
#include "bench_support.hpp"
#include "device_buffers.hpp"
#include "memory_budget.hpp"

#ifdef CUFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cuflash::tool {
namespace {

[[maybe_unused]] void print_json_row(const BenchRow& row, const BenchConfig& config, const std::string& device) {
  const BenchPoint& p = row.point;
  std::printf("{\"pass\": \"%s\", \"backend\": \"%s\", \"head_dim\": %d, \"heads\": %d, \"batch\": %d, "
              "\"seqlen\": %d, \"causal\": %s, \"dtype\": \"%s\", \"deterministic\": %s, \"device\": %s, "
              "\"flops\": %.6g, ",
              bench_pass_name(p.pass), backend_name(row.backend), p.head_dim, p.heads, p.batch, p.seqlen,
              p.causal ? "true" : "false", dtype_name(config.dtype), config.deterministic ? "true" : "false",
              json_string(device).c_str(), p.flops());
  print_json_timing(row, "tflops", row.error ? 0.0 : row.tflops());
}

[[maybe_unused]] void print_text_header() {
  std::printf("%-6s %4s %5s %5s %6s %-6s %-7s %10s %10s %10s %5s %8s %9s %8s\n", "pass", "D", "heads", "batch",
              "seqlen", "mask", "backend", "median ms", "min ms", "max ms", "reps", "TFLOP/s", "first ms", "host us");
}

[[maybe_unused]] void print_text_row(const BenchRow& row) {
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
  }

  TensorView view(const Buffer& buffer, const BenchPoint& p) const {
    return make_view(buffer.data(), dtype_, {p.batch, p.seqlen, p.heads, p.head_dim}, Device::cuda(0));
  }
  TensorView lse_view(const BenchPoint& p) const {
    return make_view(lse.data(), DType::f32, {p.batch, p.heads, p.seqlen}, Device::cuda(0));
  }

  Buffer q, k, v, dout, out, lse, dq, dk, dv;

 private:
  DType dtype_;
};

// Times one point on one backend into `row`; a failed Status ends it with row.error.
void measure(const BenchConfig& config, BenchMemory& memory, BenchScratch& scratch, std::deque<Event>& starts,
             std::deque<Event>& stops, BenchRow& row) {
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
  const RunContext context{nullptr, scratch.workspace(bytes), bytes};
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

  time_calls(config, starts, stops, call, [&scratch] { scratch.flush_l2(); }, row);
}

#endif  // CUFLASH_WITH_CUDA

// What BenchMemory (and the backward's workspace) takes at the largest point,
// in doubles: a product of flags can overflow size_t.
struct PrefillMemory {
  double host = 0.0;    // random_normal's values of one input, or one output copied back to count non-finites
  double device = 0.0;  // inputs, out, lse, gradients and the backward's fp32 dq workspace; not the L2 flush
};

PrefillMemory prefill_memory(const BenchConfig& config, const std::vector<BenchPoint>& points) {
  double elements = 0.0, rows = 0.0;
  bool backward = false;
  for (const BenchPoint& p : points) {
    elements = std::max(elements, static_cast<double>(p.batch) * p.seqlen * p.heads * p.head_dim);
    rows = std::max(rows, static_cast<double>(p.batch) * p.heads * p.seqlen);
    backward = backward || p.pass == BenchPass::fwdbwd;
  }
  const double bytes = elements * static_cast<double>(dtype_size(config.dtype));
  PrefillMemory memory;
  memory.host = 2.0 * elements;
  memory.device = (backward ? 4.0 : 3.0) * bytes + bytes + 4.0 * rows;
  if (backward) memory.device += 3.0 * bytes + 4.0 * (elements + rows);
  return memory;
}

int bench_error(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "cuflash bench: %s\n", message.c_str());
  return 1;
}

}  // namespace

int bench_command(const BenchConfig& config) {
  // Checked before the GPU is looked for: a problem too big for this host is so with or without one.
  const std::vector<BenchPoint> points = config.mode == BenchMode::prefill ? bench_points(config)
                                                                           : std::vector<BenchPoint>{};
  const PrefillMemory need = prefill_memory(config, points);
  if (const std::string refusal = memory_refusal("the largest point needs", need.host, "host memory", "random inputs",
                                                 host_bytes_available(), "available");
      !refusal.empty())
    return bench_error(refusal);
#ifndef CUFLASH_WITH_CUDA
  return bench_error("no CUDA device (this cuflash was built without CUDA); the benchmark needs a CUDA GPU");
#else
  int devices = 0;
  if (const cudaError_t result = cudaGetDeviceCount(&devices); result != cudaSuccess)
    return bench_error(std::string("no CUDA device (cudaGetDeviceCount: ") + cudaGetErrorName(result) + ": " +
                       cudaGetErrorString(result) + "); the benchmark needs a CUDA GPU");
  if (devices == 0) return bench_error("no CUDA device visible; the benchmark needs a CUDA GPU");

  cudaDeviceProp properties{};
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
  const std::string device = properties.name;
  if (config.mode == BenchMode::decode) return bench_decode(config, device, properties.major * 10 + properties.minor);

  const double device_need = need.device + static_cast<double>(l2_flush_bytes(config));
  if (const std::string refusal = memory_refusal("the largest point needs", device_need, "GPU memory",
                                                 "inputs, outputs, gradients, workspace, L2 flush",
                                                 device_bytes_free(), "free");
      !refusal.empty())
    return bench_error(refusal);

  BenchMemory memory(config, points);
  BenchScratch scratch(config);
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
  const BenchTally tally = measure_all(
      config, points, [&](BenchRow& row) { measure(config, memory, scratch, starts, stops, row); },
      [&](const BenchRow& row) {
        if (config.json) print_json_row(row, config, device);
        else print_text_row(row);
      });
  if (tally.failed > 0 && !config.json)
    std::printf("%d of %zu points failed\n", tally.failed, points.size() * config.backends.size());
  return tally.failed > 0 ? 1 : 0;
#endif
}

}  // namespace cuflash::tool
