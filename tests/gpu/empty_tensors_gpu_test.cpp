// Empty tensors in GPU memory on backends cuda, cudnn and auto: every case of
// cpu/empty_cases.hpp (the CPU suite runs the same ones on backend cpu), with
// real and with null data pointers for the empty views, outputs poisoned with
// NaN on the device; and the zero fill of gradients in padded and permuted
// layouts on a stream of the caller's. Every test skips without a GPU (the
// cudnn ones without backend cudnn).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/empty_cases.hpp"
#include "device_runner.hpp"
#include "empty_calls.hpp"

namespace cuflash::test {
namespace {

// Device copies of the call's tensors (the whole allocation, padding
// included), copied back by fetch() and freed with the memory.
class GpuMemory final : public empty::Memory {
 public:
  GpuMemory() = default;
  GpuMemory(const GpuMemory&) = delete;
  GpuMemory& operator=(const GpuMemory&) = delete;
  ~GpuMemory() override {
    for (const Placed& placed : placed_) cudaFree(placed.device);
  }

  Device device() const override { return Device::cuda(0); }

  TensorView place(HostTensor& tensor) override {
    void* data = nullptr;
    EXPECT_EQ(cudaMalloc(&data, tensor.bytes().size()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(data, tensor.bytes().data(), tensor.bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
    placed_.push_back({&tensor, data});
    return tensor.view_at(data, device());
  }

  void fetch() override {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (const Placed& placed : placed_)
      EXPECT_EQ(cudaMemcpy(placed.host->bytes().data(), placed.device, placed.host->bytes().size(),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
  }

 private:
  struct Placed {
    HostTensor* host;
    void* device;
  };
  std::vector<Placed> placed_;
};

using Param = std::tuple<Backend, DType, bool>;

class EmptyTensorsGpu : public ::testing::TestWithParam<Param> {};

TEST_P(EmptyTensorsGpu, EveryCase) {
  const auto [backend, dtype, null_empty] = GetParam();
  if (backend == Backend::cudnn) SKIP_WITHOUT_CUDNN();
  else SKIP_WITHOUT_GPU();
  empty::Target target;
  target.backend = backend;
  target.dtype = dtype;
  target.null_empty = null_empty;
  target.make_memory = [] { return std::make_unique<GpuMemory>(); };
  // What the backend refuses whatever the extents (docs/architecture.md):
  // cuda runs KV caches in f16/bf16 only; cudnn decodes (one query per
  // sequence) and takes no append.
  target.cache_rows = !(backend == Backend::cuda && dtype == DType::f32);
  target.appends = backend != Backend::cudnn;
  target.multi_query_cache = backend != Backend::cudnn;
  empty::run_all(target);
}

std::vector<Param> params() {
  std::vector<Param> list;
  for (bool null_empty : {false, true}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) list.emplace_back(Backend::cuda, dtype, null_empty);
    for (DType dtype : {DType::f16, DType::bf16}) list.emplace_back(Backend::cudnn, dtype, null_empty);
    list.emplace_back(Backend::automatic, DType::f16, null_empty);
  }
  return list;
}

INSTANTIATE_TEST_SUITE_P(Backends, EmptyTensorsGpu, ::testing::ValuesIn(params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return std::string(backend_name(std::get<0>(info.param))) + "_" +
                                  dtype_name(std::get<1>(info.param)) +
                                  (std::get<2>(info.param) ? "_null_data" : "_real_data");
                         });

// The zero fill of a backward without a (query, key) pair writes every
// logical element and no padding, on the caller's stream.
TEST(EmptyTensorsGpuZeroFill, LayoutsOnAStream) {
  SKIP_WITHOUT_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const std::vector<MemoryLayout> layouts = {MemoryLayout::row_major(), MemoryLayout::bhsd(), MemoryLayout::padded(8),
                                             MemoryLayout{{2, 0, 1, 3}, 3}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const MemoryLayout& layout : layouts) {
      HostTensor tensor(dtype, {3, 5, 4, 24}, layout);
      tensor.poison();
      GpuMemory memory;
      const TensorView view = memory.place(tensor);
      // A copy from pageable host memory may still be landing when cudaMemcpy
      // returns; the fill runs on a non-blocking stream, so wait for the poison first.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_TRUE(empty::ok(detail::fill_zeros(view, stream)));
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      memory.fetch();
      EXPECT_TRUE(empty::all_equal(tensor, "tensor", 0.0)) << dtype_name(dtype);
      const std::size_t element = dtype_size(dtype), elements = tensor.bytes().size() / element;
      std::int64_t zero_elements = 0;
      for (std::size_t e = 0; e < elements; ++e) {
        bool zero = true;
        for (std::size_t i = 0; i < element; ++i) zero = zero && tensor.bytes()[e * element + i] == std::byte{0};
        zero_elements += zero ? 1 : 0;
      }
      EXPECT_EQ(zero_elements, tensor.numel()) << "padding written (" << dtype_name(dtype) << ")";
    }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace cuflash::test
