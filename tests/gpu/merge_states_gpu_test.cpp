// backend=cuda merge_states against float64 on fresh random inputs, outputs
// poisoned with NaN on the device first; and, through the bare API, that
// backend cuda now runs attention but refuses KV caches with its reason
// (attention_*_gpu_test.cpp test both in depth). Every test skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"
#include "device_runner.hpp"

namespace cuflash::test {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// A device copy of a host tensor's whole allocation (padding included), freed on scope exit.
class DeviceCopy {
 public:
  explicit DeviceCopy(const HostTensor& host) : host_(host) {
    EXPECT_EQ(cudaMalloc(&data_, std::max<std::size_t>(host.bytes().size(), 1)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data_, host.bytes().data(), host.bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(data_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;

  TensorView view() const { return host_.view_at(data_, Device::cuda(0)); }
  void copy_back(HostTensor& host) const {
    EXPECT_EQ(cudaMemcpy(host.bytes().data(), data_, host.bytes().size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  const HostTensor& host_;
  void* data_ = nullptr;
};

struct MergeExpectation {
  std::vector<double> out, lse;
};

// The merge in float64 from the (dtype-rounded) inputs.
MergeExpectation merge_float64(const HostTensor& out_a, const HostTensor& lse_a, const HostTensor& out_b,
                               const HostTensor& lse_b) {
  const auto& shape = out_a.shape();  // [B, S, H, D]
  const std::int64_t batch = shape[0], seq = shape[1], heads = shape[2], dim = shape[3];
  MergeExpectation expected;
  expected.out.resize(static_cast<std::size_t>(out_a.numel()));
  expected.lse.resize(static_cast<std::size_t>(lse_a.numel()));
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t s = 0; s < seq; ++s)
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t lse_index = (b * heads + h) * seq + s;
        const double a = lse_a.get(lse_index), c = lse_b.get(lse_index);
        const double top = std::max(a, c);
        const bool empty = top == -std::numeric_limits<double>::infinity();
        const double weight_a = empty ? 0.0 : std::exp(a - top), weight_b = empty ? 0.0 : std::exp(c - top);
        expected.lse[lse_index] = empty ? top : top + std::log(weight_a + weight_b);
        for (std::int64_t d = 0; d < dim; ++d) {
          const std::int64_t index = ((b * seq + s) * heads + h) * dim + d;
          expected.out[index] =
              empty ? 0.0 : (weight_a * out_a.get(index) + weight_b * out_b.get(index)) / (weight_a + weight_b);
        }
      }
  return expected;
}

struct MergeCase {
  DType dtype;
  int head_dim;
  bool in_place;
};

void PrintTo(const MergeCase& c, std::ostream* os) {
  *os << dtype_name(c.dtype) << " head_dim " << c.head_dim << (c.in_place ? " in place" : "");
}

class MergeStatesGpu : public ::testing::TestWithParam<MergeCase> {};

TEST_P(MergeStatesGpu, MatchesFloat64) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const MergeCase param = GetParam();
  const std::int64_t batch = 2, seq = 37, heads = 5, dim = param.head_dim;
  // Side a in BHSD memory, side b padded, so strides are honoured.
  HostTensor out_a(param.dtype, {batch, seq, heads, dim}, MemoryLayout::bhsd());
  HostTensor out_b(param.dtype, {batch, seq, heads, dim}, MemoryLayout::padded(3));
  HostTensor lse_a(DType::f32, {batch, heads, seq}), lse_b(DType::f32, {batch, heads, seq});
  out_a.fill_normal(rng.engine());
  out_b.fill_normal(rng.engine());
  lse_a.fill_normal(rng.engine(), 3.0);
  lse_b.fill_normal(rng.engine(), 3.0);
  // Rows where one side, or both, saw no key.
  const double minus_inf = -std::numeric_limits<double>::infinity();
  for (std::int64_t row = 0; row < lse_a.numel(); row += 7) lse_a.set(row, minus_inf);
  for (std::int64_t row = 0; row < lse_b.numel(); row += 5) lse_b.set(row, minus_inf);
  const MergeExpectation expected = merge_float64(out_a, lse_a, out_b, lse_b);

  HostTensor out(param.dtype, {batch, seq, heads, dim}), lse(DType::f32, {batch, heads, seq});
  out.poison();
  lse.poison();
  DeviceCopy device_out_a(out_a), device_out_b(out_b), device_lse_a(lse_a), device_lse_b(lse_b);
  DeviceCopy device_out(out), device_lse(lse);
  MergeArgs args;
  args.out_a = device_out_a.view();
  args.lse_a = device_lse_a.view();
  args.out_b = device_out_b.view();
  args.lse_b = device_lse_b.view();
  args.out = param.in_place ? args.out_a : device_out.view();
  args.lse = param.in_place ? args.lse_a : device_lse.view();
  const Status status = merge_states(args, Backend::cuda);
  ASSERT_TRUE(status.ok()) << status.to_string();
  ASSERT_CUDA(cudaDeviceSynchronize());

  HostTensor merged_out = param.in_place ? out_a : out;
  HostTensor merged_lse = param.in_place ? lse_a : lse;
  (param.in_place ? device_out_a : device_out).copy_back(merged_out);
  (param.in_place ? device_lse_a : device_lse).copy_back(merged_lse);
  ASSERT_TRUE(all_written(merged_out, "out"));
  ASSERT_TRUE(all_written(merged_lse, "lse"));
  const ErrorStats out_error = compare(merged_out, expected.out);
  const ErrorStats lse_error = compare(merged_lse, expected.lse);
  // Inputs of unit scale: f32 keeps ~1e-6; f16/bf16 lose only the final rounding.
  const double out_bound = param.dtype == DType::f32 ? 1e-5 : param.dtype == DType::f16 ? 3e-3 : 1e-2;
  EXPECT_EQ(out_error.mismatches, 0) << out_error.describe();
  EXPECT_LE(out_error.rel_l2, out_bound) << out_error.describe();
  EXPECT_EQ(lse_error.mismatches, 0) << lse_error.describe();
  EXPECT_LE(lse_error.max_abs, 1e-5) << lse_error.describe();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MergeStatesGpu,
                         ::testing::Values(MergeCase{DType::f32, 64, false}, MergeCase{DType::f16, 128, false},
                                           MergeCase{DType::bf16, 40, false}, MergeCase{DType::bf16, 256, true},
                                           MergeCase{DType::f32, 96, true}),
                         [](const ::testing::TestParamInfo<MergeCase>& info) {
                           return std::string(dtype_name(info.param.dtype)) + "_d" +
                                  std::to_string(info.param.head_dim) + (info.param.in_place ? "_in_place" : "");
                         });

// The attention kernels run (bf16, on the default stream, no workspace
// given): dense, then the same q as a decode step over a contiguous cache,
// which cuda runs itself (the decode kernel), and auto runs on a GPU backend.
TEST(CudaBackendGpu, AttentionRunsDenseAndKvCache) {
  SKIP_WITHOUT_GPU();
  const std::int64_t batch = 1, seq = 16, heads = 2, dim = 64;
  HostTensor q(DType::bf16, {batch, seq, heads, dim}), k(DType::bf16, {batch, seq, heads, dim});
  HostTensor out(DType::bf16, {batch, seq, heads, dim});
  q.fill(0.5);
  k.fill(0.25);
  out.poison();
  DeviceCopy device_q(q), device_k(k), device_out(out);
  ForwardArgs args;
  args.q = device_q.view();
  args.k = device_k.view();
  args.v = device_k.view();
  args.out = device_out.view();
  AttentionOptions options;
  options.backend = Backend::cuda;
  Status status = attention_forward(args, options);
  ASSERT_TRUE(status.ok()) << status.to_string();
  ASSERT_CUDA(cudaDeviceSynchronize());
  device_out.copy_back(out);
  // Every key equal: out is v's row exactly (0.25 is exact in bf16).
  for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get(i), 0.25) << "element " << i;

  // The same q as 16 queries over a contiguous cache [B, capacity 16, H, D]
  // holding 8 keys (not causal: every query sees all 8).
  const HostTensor seqlens_k = HostTensor::from_i32({8}, {batch});
  for (Backend backend : {Backend::cuda, Backend::automatic}) {
    SCOPED_TRACE(backend_name(backend));
    out.poison();
    DeviceCopy device_seqlens(seqlens_k), device_out2(out);
    args.out = device_out2.view();
    args.kv_cache.seqlens_k = device_seqlens.view();
    options.backend = backend;
    status = attention_forward(args, options);
    ASSERT_TRUE(status.ok()) << status.to_string();
    ASSERT_CUDA(cudaDeviceSynchronize());
    device_out2.copy_back(out);
    for (std::int64_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.get(i), 0.25) << "element " << i;
  }
}

}  // namespace
}  // namespace cuflash::test
