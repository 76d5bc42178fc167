// Linear attention has no GPU kernels yet: on GPU memory backend cuda, cudnn
// and auto refuse the forward, the backward and the decode step as
// `unsupported`, naming the op, and write nothing (no silent fallback).
// Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuflash/cuflash.hpp"
#include "device_runner.hpp"

namespace cuflash::test {
namespace {

constexpr unsigned char kPattern = 0x7F;

// One device allocation filled with kPattern bytes, freed on scope exit.
class PatternedBuffer {
 public:
  explicit PatternedBuffer(std::size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes_), cudaSuccess);
    EXPECT_EQ(cudaMemset(data_, kPattern, bytes_), cudaSuccess);
  }
  ~PatternedBuffer() { cudaFree(data_); }
  PatternedBuffer(const PatternedBuffer&) = delete;
  PatternedBuffer& operator=(const PatternedBuffer&) = delete;

  void* data() const { return data_; }
  bool untouched() const {
    std::vector<unsigned char> host(bytes_);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    for (unsigned char byte : host)
      if (byte != kPattern) return false;
    return true;
  }

 private:
  std::size_t bytes_;
  void* data_ = nullptr;
};

TEST(LinearAttentionGpu, RefusedByNameWithNothingWritten) {
  SKIP_WITHOUT_GPU();
  constexpr std::int64_t kBatch = 2, kSeq = 16, kHeadsQ = 4, kHeadsKv = 2, kKeyDim = 64, kValueDim = 64;
  const Device gpu = Device::cuda(0);
  PatternedBuffer q(kBatch * kSeq * kHeadsQ * kKeyDim * 2), k(kBatch * kSeq * kHeadsKv * kKeyDim * 2);
  PatternedBuffer v(kBatch * kSeq * kHeadsKv * kValueDim * 2), dout(kBatch * kSeq * kHeadsQ * kValueDim * 2);
  PatternedBuffer out(kBatch * kSeq * kHeadsQ * kValueDim * 2), dq(kBatch * kSeq * kHeadsQ * kKeyDim * 2);
  PatternedBuffer dk(kBatch * kSeq * kHeadsKv * kKeyDim * 2), dv(kBatch * kSeq * kHeadsKv * kValueDim * 2);
  PatternedBuffer state(kBatch * kHeadsKv * kKeyDim * kValueDim * 4);

  LinearForwardArgs forward;
  forward.q = make_view(q.data(), DType::bf16, {kBatch, kSeq, kHeadsQ, kKeyDim}, gpu);
  forward.k = make_view(k.data(), DType::bf16, {kBatch, kSeq, kHeadsKv, kKeyDim}, gpu);
  forward.v = make_view(v.data(), DType::bf16, {kBatch, kSeq, kHeadsKv, kValueDim}, gpu);
  forward.out = make_view(out.data(), DType::bf16, {kBatch, kSeq, kHeadsQ, kValueDim}, gpu);
  forward.final_state = make_view(state.data(), DType::f32, {kBatch, kHeadsKv, kKeyDim, kValueDim}, gpu);

  LinearBackwardArgs backward;
  backward.q = forward.q;
  backward.k = forward.k;
  backward.v = forward.v;
  backward.dout = make_view(dout.data(), DType::bf16, {kBatch, kSeq, kHeadsQ, kValueDim}, gpu);
  backward.dq = make_view(dq.data(), DType::bf16, {kBatch, kSeq, kHeadsQ, kKeyDim}, gpu);
  backward.dk = make_view(dk.data(), DType::bf16, {kBatch, kSeq, kHeadsKv, kKeyDim}, gpu);
  backward.dv = make_view(dv.data(), DType::bf16, {kBatch, kSeq, kHeadsKv, kValueDim}, gpu);

  LinearStepArgs step;  // one token: the first rows of the same buffers; the state in place
  step.q = make_view(q.data(), DType::bf16, {kBatch, 1, kHeadsQ, kKeyDim}, gpu);
  step.k = make_view(k.data(), DType::bf16, {kBatch, 1, kHeadsKv, kKeyDim}, gpu);
  step.v = make_view(v.data(), DType::bf16, {kBatch, 1, kHeadsKv, kValueDim}, gpu);
  step.out = make_view(out.data(), DType::bf16, {kBatch, 1, kHeadsQ, kValueDim}, gpu);
  step.state = forward.final_state;

  for (Backend backend : {Backend::automatic, Backend::cuda, Backend::cudnn}) {
    if (backend == Backend::cudnn && !backend_available(Backend::cudnn)) continue;
    SCOPED_TRACE(std::string("backend ") + backend_name(backend));
    LinearAttentionOptions options;
    options.backend = backend;
    for (const Status& status : {linear_attention_forward(forward, options), linear_attention_backward(backward, options),
                                 linear_attention_step(step, options)}) {
      EXPECT_EQ(status.code(), StatusCode::unsupported) << status.to_string();
      EXPECT_NE(status.message().find("linear attention"), std::string::npos) << status.message();
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const PatternedBuffer* written : {&out, &state, &dq, &dk, &dv}) EXPECT_TRUE(written->untouched());
}

}  // namespace
}  // namespace cuflash::test
