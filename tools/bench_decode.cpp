#include "bench_decode.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "cuflash/cuflash.hpp"
#include "device_buffers.hpp"

namespace cuflash::tool {
namespace {

[[maybe_unused]] void print_json_row(const BenchRow& row, const BenchConfig& config, const std::string& device) {
  const BenchPoint& p = row.point;
  std::printf("{\"sweep\": \"decode\", \"pass\": \"fwd\", \"backend\": \"%s\", \"batch\": %d, \"kv_len\": %d, "
              "\"heads_q\": %d, \"heads_kv\": %d, \"head_dim\": %d, \"page_size\": %d, \"q_len\": %d, "
              "\"causal\": %s, \"dtype\": \"%s\", \"device\": %s, \"kv_bytes\": %.6g, \"skipped\": %s, ",
              backend_name(row.backend), p.batch, p.kv_len, p.heads, p.heads_kv, p.head_dim, p.page_size, p.seqlen,
              p.causal ? "true" : "false", dtype_name(config.dtype), json_string(device).c_str(), p.kv_bytes(),
              row.skipped ? "true" : "false");
  print_json_timing(row, "gbps", row.error ? 0.0 : row.gbps());
}

[[maybe_unused]] void print_text_header() {
  std::printf("%4s %7s %5s %5s %7s %-7s %10s %8s %5s %9s %8s\n", "D", "Hq/Hk", "page", "batch", "kv_len", "backend",
              "median us", "GB/s", "reps", "first ms", "host us");
}

[[maybe_unused]] void print_text_row(const BenchRow& row) {
  const BenchPoint& p = row.point;
  const std::string heads = std::to_string(p.heads) + "/" + std::to_string(p.heads_kv);
  std::printf("%4d %7s %5d %5d %7d %-7s ", p.head_dim, heads.c_str(), p.page_size, p.batch, p.kv_len,
              backend_name(row.backend));
  if (row.error)
    std::printf("%s: %s\n", row.skipped ? "skipped" : "failed", row.error->c_str());
  else
    std::printf("%10.2f %8.1f %5d %9.2f %8.1f\n", row.median_ms * 1e3, row.gbps(), row.reps, row.first_call_ms,
                row.host_us);
  std::fflush(stdout);
}

#ifdef CUFLASH_WITH_CUDA

// Caches of a large point reach tens of GiB: they are filled by tiling one
// block of random values, drawn once on the host. 16 MiB is above any L2,
// so the repetition cannot make reads hit a cache.
constexpr std::size_t kPatternElements = std::size_t{8} << 20;
// Left free after a point's tensors: workspaces, cuDNN's graphs, the L2 flush.
constexpr std::size_t kMemoryMargin = std::size_t{2} << 30;

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// The tensors of one point, allocated for it alone: points differ by five
// orders of magnitude, so nothing is kept at the largest size.
struct DecodeTensors {
  Buffer q, k, v, out, lse, seqlens, block_table;
  int max_pages = 0, num_pages = 0;
  ForwardArgs args;
};

// In doubles: a product of flags can overflow size_t, and such a point is skipped, not allocated.
double point_bytes(const BenchPoint& p, std::size_t element) {
  const double q_elements = static_cast<double>(p.batch) * p.seqlen * p.heads * p.head_dim;
  const double pages = p.page_size > 0 ? static_cast<double>(p.batch) * std::ceil(double(p.kv_len) / p.page_size) : 0;
  const double cache_rows = p.page_size > 0 ? pages * p.page_size : static_cast<double>(p.batch) * p.kv_len;
  return (2.0 * q_elements + 2.0 * cache_rows * p.heads_kv * p.head_dim) * static_cast<double>(element) +
         static_cast<double>(p.batch) * p.heads * p.seqlen * sizeof(float) + (pages + p.batch) * sizeof(std::int32_t);
}

class DecodeMemory {
 public:
  explicit DecodeMemory(const BenchConfig& config) : config_(config) {
    const std::vector<std::uint16_t> values = random_normal(kPatternElements, config.dtype, config.seed);
    pattern_ = Buffer::raw(Placement::cuda, kPatternElements * 2);
    check_cuda(cudaMemcpy(pattern_.data(), values.data(), kPatternElements * 2, cudaMemcpyHostToDevice),
               "cudaMemcpy to the GPU");
  }

  // Random values into `bytes` of a 16-bit buffer (the pattern, tiled).
  void fill(const Buffer& buffer, std::size_t bytes) const {
    const std::size_t chunk = kPatternElements * 2;
    auto* dst = static_cast<unsigned char*>(buffer.data());
    for (std::size_t offset = 0; offset < bytes; offset += chunk)
      check_cuda(cudaMemcpyAsync(dst + offset, pattern_.data(), std::min(chunk, bytes - offset),
                                 cudaMemcpyDeviceToDevice, nullptr),
                 "cudaMemcpyAsync (fill)");
  }

  // The point's q, caches, out, lse and index tensors; the block table a
  // shuffled permutation of the pages, as an allocator that has run a while
  // hands them out (--ordered-pages: in order, to measure what that costs).
  void allocate(const BenchPoint& p, DecodeTensors* t) const {
    const DType dtype = config_.dtype;
    const std::size_t element = dtype_size(dtype);
    const Device gpu = Device::cuda(0);
    const std::int64_t B = p.batch, S = p.seqlen, Hq = p.heads, Hk = p.heads_kv, D = p.head_dim;
    const std::size_t q_bytes = std::size_t(B * S * Hq * D) * element;
    t->q = Buffer::raw(Placement::cuda, q_bytes);
    t->out = Buffer::raw(Placement::cuda, q_bytes);
    t->lse = Buffer::raw(Placement::cuda, std::size_t(B * Hq * S) * sizeof(float));
    fill(t->q, q_bytes);
    std::int64_t cache_outer = B, cache_slots = p.kv_len;  // [outer, slots, Hk, D]
    if (p.page_size > 0) {
      t->max_pages = static_cast<int>(ceil_div(p.kv_len, p.page_size));
      t->num_pages = p.batch * t->max_pages;
      cache_outer = t->num_pages;
      cache_slots = p.page_size;
      std::vector<std::int32_t> table(t->num_pages);
      std::iota(table.begin(), table.end(), 0);
      if (config_.shuffle_pages)
        std::shuffle(table.begin(), table.end(), std::mt19937(static_cast<unsigned>(config_.seed)));
      t->block_table = Buffer::raw(Placement::cuda, table.size() * sizeof(std::int32_t));
      check_cuda(cudaMemcpy(t->block_table.data(), table.data(), table.size() * sizeof(std::int32_t),
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy to the GPU");
    }
    const std::size_t cache_bytes = std::size_t(cache_outer * cache_slots * Hk * D) * element;
    t->k = Buffer::raw(Placement::cuda, cache_bytes);
    t->v = Buffer::raw(Placement::cuda, cache_bytes);
    fill(t->k, cache_bytes);
    fill(t->v, cache_bytes);
    const std::vector<std::int32_t> seqlens(p.batch, p.kv_len);
    t->seqlens = Buffer::raw(Placement::cuda, seqlens.size() * sizeof(std::int32_t));
    check_cuda(cudaMemcpy(t->seqlens.data(), seqlens.data(), seqlens.size() * sizeof(std::int32_t),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy to the GPU");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the fill");

    ForwardArgs& a = t->args;
    a.q = make_view(t->q.data(), dtype, {B, S, Hq, D}, gpu);
    a.out = make_view(t->out.data(), dtype, {B, S, Hq, D}, gpu);
    a.lse = make_view(t->lse.data(), DType::f32, {B, Hq, S}, gpu);
    a.k = make_view(t->k.data(), dtype, {cache_outer, cache_slots, Hk, D}, gpu);
    a.v = make_view(t->v.data(), dtype, {cache_outer, cache_slots, Hk, D}, gpu);
    a.kv_cache.seqlens_k = make_view(t->seqlens.data(), DType::i32, {B}, gpu);
    if (p.page_size > 0)
      a.kv_cache.block_table = make_view(t->block_table.data(), DType::i32, {B, std::int64_t{t->max_pages}}, gpu);
  }

 private:
  const BenchConfig& config_;
  Buffer pattern_;
};

void measure(const BenchConfig& config, DecodeMemory& memory, BenchScratch& scratch, std::deque<Event>& starts,
             std::deque<Event>& stops, BenchRow& row) {
  const BenchPoint& p = row.point;
  std::size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double needed = point_bytes(p, dtype_size(config.dtype));
  if (needed + static_cast<double>(kMemoryMargin) > static_cast<double>(free_bytes)) {
    row.skipped = true;
    // In MiB, as bench/decode.py words its peers' skips.
    char text[160];
    std::snprintf(text, sizeof text, "skipped: the point's tensors need %.0f MiB, %zu MiB of GPU memory are free "
                  "(keeping %zu MiB)", std::floor(needed / (1 << 20)), free_bytes >> 20, kMemoryMargin >> 20);
    row.error = text;
    return;
  }
  DecodeTensors t;
  memory.allocate(p, &t);

  AttentionOptions options;
  options.causal = p.causal;
  options.backend = row.backend;
  auto fail = [&row](const Status& status) { row.error = status.to_string(); };
  using Clock = std::chrono::steady_clock;
  // The first call checks the indices on the host (and cudnn builds its graph then).
  const auto query_start = Clock::now();
  // The timed calls skip the host check of the indices (below); the
  // workspace is the larger of the two queries' answers.
  AttentionOptions unchecked = options;
  unchecked.check_index_contents = false;
  std::size_t bytes = 0, unchecked_bytes = 0;
  if (Status status = forward_workspace_size(t.args, options, &bytes); !status.ok()) return fail(status);
  if (Status status = forward_workspace_size(t.args, unchecked, &unchecked_bytes); !status.ok()) return fail(status);
  bytes = std::max(bytes, unchecked_bytes);
  const RunContext context{nullptr, scratch.workspace(bytes), bytes};
  const std::size_t out_elements = std::size_t(p.batch) * p.seqlen * p.heads * p.head_dim;
  const std::size_t lse_elements = std::size_t(p.batch) * p.heads * p.seqlen;
  check_cuda(cudaMemset(t.out.data(), 0xff, out_elements * dtype_size(config.dtype)), "cudaMemset");
  check_cuda(cudaMemset(t.lse.data(), 0xff, lse_elements * sizeof(float)), "cudaMemset");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize before the first call");
  if (Status status = attention_forward(t.args, options, context); !status.ok()) return fail(status);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize after the first call");
  row.first_call_ms = std::chrono::duration<double, std::milli>(Clock::now() - query_start).count();
  std::string bad;
  if (const std::size_t n = count_nonfinite(t.out, out_elements, config.dtype); n > 0)
    bad = "out " + std::to_string(n) + " of " + std::to_string(out_elements);
  if (const std::size_t n = count_nonfinite_f32(t.lse, lse_elements); n > 0)
    bad += std::string(bad.empty() ? "" : ", ") + "lse " + std::to_string(n) + " of " + std::to_string(lse_elements);
  if (!bad.empty()) {
    row.error = "outputs not finite after the call (" + bad + ")";
    return;
  }
  // A decode loop whose indices are known good skips the host copy (and its
  // stream synchronization) on every step; so do the timed calls.
  auto call = [&]() -> Status { return attention_forward(t.args, unchecked, context); };
  time_calls(config, starts, stops, call, [&scratch] { scratch.flush_l2(); }, row);
}

#endif  // CUFLASH_WITH_CUDA

}  // namespace

int bench_decode(const BenchConfig& config, const std::string& device, int sm) {
#ifndef CUFLASH_WITH_CUDA
  (void)config;
  (void)device;
  (void)sm;
  return 1;
#else
  const std::vector<BenchPoint> points = bench_points(config);
  DecodeMemory memory(config);
  BenchScratch scratch(config);
  std::deque<Event> starts(1), stops(1);  // a deque: events neither copy nor move
  if (!config.json) {
    std::printf("cuflash %s bench (decode): %s (sm_%d), %s, q [B, %d, Hq, D] against a KV cache of kv_len keys\n",
                version(), device.c_str(), sm, dtype_name(config.dtype), config.q_len);
    std::printf("timing: CUDA-event median per call after a %g ms warm-up%s; GB/s = K and V bytes read"
                " (2*B*kv_len*Hk*D*2) / median; page 0: a contiguous cache\n",
                config.warmup_ms, config.flush_l2 ? ", L2 overwritten before each call" : "");
    print_text_header();
  }
  const BenchTally tally = measure_all(
      config, points, [&](BenchRow& row) { measure(config, memory, scratch, starts, stops, row); },
      [&](const BenchRow& row) {
        if (config.json) print_json_row(row, config, device);
        else print_text_row(row);
      });
  if (!config.json && (tally.failed > 0 || tally.skipped > 0))
    std::printf("%d of %zu points failed, %d skipped\n", tally.failed, points.size() * config.backends.size(),
                tally.skipped);
  return tally.failed > 0 ? 1 : 0;
#endif
}

}  // namespace cuflash::tool
