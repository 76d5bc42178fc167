#include "bench_support.hpp"

#include <cstdio>
#include <random>
#include <stdexcept>
#include <thread>

#include "half_convert.hpp"

namespace cuflash::tool {

#ifdef CUFLASH_WITH_CUDA
void StreamGate::close() {
  holds_.push_back({this, static_cast<long long>(holds_.size()) + 1});
  pending_.fetch_add(1, std::memory_order_acq_rel);
  const cudaError_t result = cudaLaunchHostFunc(nullptr, &StreamGate::hold, &holds_.back());
  if (result != cudaSuccess) {
    pending_.fetch_sub(1, std::memory_order_acq_rel);
    holds_.pop_back();
    check_cuda(result, "cudaLaunchHostFunc");
  }
}

void CUDART_CB StreamGate::hold(void* hold) {
  const Hold& h = *static_cast<const Hold*>(hold);
  StreamGate* self = h.gate;
  const auto deadline = std::chrono::steady_clock::now() + kMaxHold;
  while (self->released_.load(std::memory_order_acquire) < h.call) {
    if (std::chrono::steady_clock::now() > deadline) {
      self->held_too_long_.store(true, std::memory_order_release);
      break;
    }
  }
  self->pending_.fetch_sub(1, std::memory_order_acq_rel);
}

StreamGate::~StreamGate() {
  released_.store(static_cast<long long>(holds_.size()), std::memory_order_release);
  while (pending_.load(std::memory_order_acquire) > 0) std::this_thread::yield();
}
#endif

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

void print_json_timing(const BenchRow& row, const char* rate_key, double rate) {
  if (row.error)
    std::printf("\"reps\": 0, \"median_ms\": null, \"min_ms\": null, \"max_ms\": null, \"%s\": null, "
                "\"first_call_ms\": null, \"host_us\": null, \"error\": %s}\n",
                rate_key, json_string(*row.error).c_str());
  else
    std::printf("\"reps\": %d, \"median_ms\": %.6g, \"min_ms\": %.6g, \"max_ms\": %.6g, \"%s\": %.6g, "
                "\"first_call_ms\": %.6g, \"host_us\": %.6g, \"error\": null}\n",
                row.reps, row.median_ms, row.min_ms, row.max_ms, rate_key, rate, row.first_call_ms, row.host_us);
  std::fflush(stdout);
}

#ifdef CUFLASH_WITH_CUDA

void check_cuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorName(result) + ": " +
                             cudaGetErrorString(result));
}

std::size_t l2_flush_bytes(const BenchConfig& config) {
  if (!config.flush_l2) return 0;
  int l2_bytes = 0;
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, 0), "cudaDeviceGetAttribute");
  return std::max<std::size_t>(2 * std::size_t(l2_bytes), 32u << 20);
}

BenchScratch::BenchScratch(const BenchConfig& config) : flush_bytes_(l2_flush_bytes(config)) {
  if (flush_bytes_ > 0) flush_ = Buffer::raw(Placement::cuda, flush_bytes_);
}

void* BenchScratch::workspace(std::size_t bytes) {
  if (bytes > workspace_bytes_) {
    workspace_ = Buffer();
    workspace_ = Buffer::raw(Placement::cuda, bytes);
    workspace_bytes_ = bytes;
  }
  return workspace_.data();
}

void BenchScratch::flush_l2() {
  if (flush_bytes_ > 0) check_cuda(cudaMemsetAsync(flush_.data(), 0, flush_bytes_, nullptr), "cudaMemsetAsync");
}

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

#endif  // CUFLASH_WITH_CUDA

}  // namespace cuflash::tool
