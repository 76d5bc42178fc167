// backend=cudnn beyond the numbers: scratch memory (no workspace, too small a
// workspace), the default stream, views cuDNN cannot read (refused, nothing
// written), `auto` on a KV cache, concurrent callers
// sharing the graph cache, and the cost of the first call of a shape (graph
// build) against a cached one, printed as a note for the GPU check's summary.
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "cudnn_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

TEST(CudnnWorkspace, NoneGivenStillRuns) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  DeviceRunner runner(Backend::cudnn);
  runner.workspace_mode = WorkspaceMode::none;
  CaseSpec f = causal(varlen_case("varlen", {5, 0, 70, 1}, {5, 0, 70, 1}, 4, 2, 64));
  f.dtype = DType::bf16;
  AttentionCase fwd(f, rng.engine());
  check_forward_gpu(fwd, runner);
  CaseSpec b = causal(dense_case("bwd_q_longer", 70, 33, 4, 2, 64));
  b.dtype = DType::f16;
  AttentionCase bwd(b, rng.engine());
  check_backward_gpu(bwd, runner);
}

TEST(CudnnWorkspace, TooSmallIsInvalidArgument) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(varlen_case("varlen", {5, 0, 70, 7}, {12, 3, 70, 0}, 4, 2, 64));
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  c.set_forward_outputs(std::vector<double>(c.out.numel(), 0.0), std::vector<double>(c.lse.numel(), 0.0));
  DeviceRunner runner(Backend::cudnn);
  runner.workspace_mode = WorkspaceMode::too_small;
  const AttentionCase before = c;
  const Status status = runner.backward(c, c.options(Backend::cudnn));
  ASSERT_TRUE(runner.last_workspace_status.ok()) << runner.last_workspace_status.to_string();
  ASSERT_GT(runner.last_workspace_bytes, 0u) << "a varlen backward needs scratch (offsets, stats)";
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("workspace"), std::string::npos) << status.message();
  expect_case_unchanged(before, c);
}

TEST(CudnnStream, DefaultStream) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(dense_case("default_stream", 65, 130, 4, 2, 64));
  s.dtype = DType::f16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(Backend::cudnn);
  runner.default_stream = true;
  check_forward_gpu(c, runner);
  check_backward_gpu(c, runner);
}

// cuDNN reads 16-byte vectors and does not check addresses: such views are refused.
TEST(CudnnAlignment, RowsOff16BytesAreRefused) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  for (TestPass pass : {TestPass::forward, TestPass::backward}) {
    CaseSpec s = causal(dense_case("address_plus_4", 65, 100, 4, 2, 64));
    s.dtype = DType::bf16;
    AttentionCase c(s, rng.engine());
    c.set_forward_outputs(std::vector<double>(c.out.numel(), 0.0), std::vector<double>(c.lse.numel(), 0.0));
    DeviceRunner runner(Backend::cudnn);
    runner.misalign_bytes = 4;
    runner.misalign_only = pass == TestPass::forward ? "v" : "dq";
    expect_refused(c, runner, pass, {"backend cudnn", "16-byte"}, Backend::cudnn);

    CaseSpec padded = s;
    padded.row_padding = 4;  // rows of 68 bf16 elements: strides not multiples of 8
    AttentionCase p(padded, rng.engine());
    p.set_forward_outputs(std::vector<double>(p.out.numel(), 0.0), std::vector<double>(p.lse.numel(), 0.0));
    DeviceRunner aligned(Backend::cudnn);
    expect_refused(p, aligned, pass, {"backend cudnn", "multiples of 8"}, Backend::cudnn);
  }
}

// A decode step without an append: auto may take either GPU backend (its
// table has no decode rows yet); whichever it takes must be right.
TEST(CudnnAuto, KvCacheDecodeRuns) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = kv_cache_case("auto_paged16_decode", 16, 1, 0, {300, 0, 77});
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(Backend::automatic);
  check_forward_gpu(c, runner);
}

// Several threads, each with its own stream, call the same shape at once: one
// graph is built, every call is right.
TEST(CudnnThreads, ConcurrentCallsShareTheGraphCache) {
  SKIP_WITHOUT_CUDNN();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      std::mt19937 engine(1234 + t);
      CaseSpec s = causal(varlen_case("threads", {33, 0, 130, 7}, {40, 5, 130, 7}, 8, 2, 128));
      s.dtype = t % 2 ? DType::bf16 : DType::f16;
      AttentionCase c(s, engine);
      DeviceRunner runner(Backend::cudnn);
      check_forward_gpu(c, runner);
      check_backward_gpu(c, runner);
    });
  for (std::thread& thread : threads) thread.join();
}

// The first call of a shape builds its graph; later ones find it in the
// cache. Host wall time of a call (launch to stream idle), printed for the log.
TEST(CudnnGraphCache, FirstCallBuildsLaterCallsReuse) {
  SKIP_WITHOUT_CUDNN();
  // An unusual shape, so that no earlier test built its graph.
  const int batch = 3, seq = 333, heads = 5, dim = 64;
  const std::size_t elements = std::size_t(batch) * seq * heads * dim;
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *lse = nullptr;
  for (void** p : {&q, &k, &v, &out}) ASSERT_EQ(cudaMalloc(p, elements * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&lse, std::size_t(batch) * heads * seq * 4), cudaSuccess);
  for (void* p : {q, k, v}) ASSERT_EQ(cudaMemset(p, 0x3c, elements * 2), cudaSuccess);  // 1.0-ish f16
  ForwardArgs args;
  const Device gpu = Device::cuda(0);
  args.q = make_view(q, DType::f16, {batch, seq, heads, dim}, gpu);
  args.k = make_view(k, DType::f16, {batch, seq, heads, dim}, gpu);
  args.v = make_view(v, DType::f16, {batch, seq, heads, dim}, gpu);
  args.out = make_view(out, DType::f16, {batch, seq, heads, dim}, gpu);
  args.lse = make_view(lse, DType::f32, {batch, heads, seq}, gpu);
  AttentionOptions options;
  options.causal = true;
  options.backend = Backend::cudnn;
  auto timed_call = [&]() {
    const auto start = std::chrono::steady_clock::now();
    const Status status = attention_forward(args, options);
    EXPECT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  };
  const double first_us = timed_call();
  std::vector<double> later;
  for (int i = 0; i < 21; ++i) later.push_back(timed_call());
  std::sort(later.begin(), later.end());
  const double cached_us = later[later.size() / 2];
  std::printf("[ note ] cudnn graph cache: first call %.1f ms (graph build), cached call %.1f us "
              "(B=3 S=333 H=5 D=64 f16 causal forward, host wall time incl. sync)\n",
              first_us / 1000.0, cached_us);
  EXPECT_LT(cached_us, first_us);
  for (void* p : {q, k, v, out, lse}) EXPECT_EQ(cudaFree(p), cudaSuccess);
}

}  // namespace
}  // namespace cuflash::test
