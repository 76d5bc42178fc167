// Empty tensors on backend cpu (and auto, in host memory): every case of
// empty_cases.hpp in every dtype, with real and with null data pointers for
// the empty views; then the checks that still apply to empty tensors.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cpu/empty_cases.hpp"
#include "empty_calls.hpp"

namespace cuflash::test {
namespace {

using empty::Call;
using empty::HostMemory;
using empty::Target;

Target host_target(Backend backend, DType dtype, bool null_empty) {
  Target target;
  target.backend = backend;
  target.dtype = dtype;
  target.null_empty = null_empty;
  target.make_memory = [] { return std::make_unique<HostMemory>(); };
  return target;
}

class CpuEmptyTensors : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(CpuEmptyTensors, EveryCase) {
  const auto [dtype, null_empty] = GetParam();
  empty::run_all(host_target(Backend::cpu, dtype, null_empty));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CpuEmptyTensors,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<DType, bool>>& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_null_data" : "_real_data");
                         });

TEST(CpuEmptyTensorsAuto, HostMemoryTakesNoKernel) {
  const Target target = host_target(Backend::automatic, DType::f32, true);
  empty::dense_forward(target, {0, 5, 7, 4, 2});
  empty::dense_forward(target, {2, 5, 0, 4, 2});
  empty::dense_backward(target, {2, 0, 7, 4, 2});
  empty::varlen_forward(target, {{0}, {0}, 0, 0, 0, 0});
  empty::merge_empty(target, 0, 3, 2);
}

// The checks that do not depend on extents still run on empty tensors, and a
// failed check still writes nothing.
class EmptyTensorChecks : public ::testing::Test {
 protected:
  Target target = host_target(Backend::cpu, DType::f32, false);
  Call call{target};
  HostTensor q = call.input({2, 0, 8, 64});
  HostTensor k = call.input({2, 7, 2, 64});
  HostTensor v = call.input({2, 7, 2, 64});
  HostTensor out = call.output({2, 0, 8, 64});
  HostTensor lse = Call::lse({2, 8, 0});

  ForwardArgs args() {
    ForwardArgs a;
    a.q = q.view();
    a.k = k.view();
    a.v = v.view();
    a.out = out.view();
    a.lse = lse.view();
    return a;
  }

  void expect_invalid(const ForwardArgs& a, const std::string& fragment) {
    const Status status = attention_forward(a, target.options());
    EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
    EXPECT_NE(status.message().find(fragment), std::string::npos) << "\"" << status.message() << "\" lacks \"" << fragment << "\"";
  }
};

TEST_F(EmptyTensorChecks, ValidEmptyCallSucceeds) { EXPECT_TRUE(empty::ok(attention_forward(args(), target.options()))); }

TEST_F(EmptyTensorChecks, ZeroHeadDimIsRefused) {
  HostTensor q0 = call.input({2, 5, 8, 0});
  HostTensor k0 = call.input({2, 7, 2, 0});
  HostTensor out0 = call.output({2, 5, 8, 0});
  ForwardArgs a = args();
  a.q = q0.view();
  a.k = a.v = k0.view();
  a.out = out0.view();
  a.lse = {};
  expect_invalid(a, "q: head_dim (the last dimension of [batch, seqlen_q, heads_q, head_dim]) must be >= 1 "
                    "(flash-attn refuses 0 as well), got shape [2, 5, 8, 0]");
  // Even with nothing else in the call.
  HostTensor q1 = call.input({0, 0, 0, 0});
  a.q = a.out = q1.view();
  a.k = a.v = q1.view();
  expect_invalid(a, "q: head_dim");
}

TEST_F(EmptyTensorChecks, HeadDimMismatch) {
  HostTensor k32 = call.input({2, 7, 2, 32});
  ForwardArgs a = args();
  a.k = a.v = k32.view();
  expect_invalid(a, "k: head_dim (last dim) expected 64 (like q), got 32");
}

TEST_F(EmptyTensorChecks, BatchMismatch) {
  HostTensor q0 = call.input({0, 5, 8, 64});
  HostTensor out0 = call.output({0, 5, 8, 64});
  HostTensor lse0 = Call::lse({0, 8, 5});
  ForwardArgs a = args();
  a.q = q0.view();
  a.out = out0.view();
  a.lse = lse0.view();
  expect_invalid(a, "k: dim 0 (batch) expected 0 (like q), got 2");
}

TEST_F(EmptyTensorChecks, OutputShapeAndDtype) {
  HostTensor wrong_out = call.output({2, 1, 8, 64});
  ForwardArgs a = args();
  a.out = wrong_out.view();
  expect_invalid(a, "out: expected shape [2, 0, 8, 64] (like q), got [2, 1, 8, 64]");
  HostTensor wrong_lse = Call::lse({2, 4, 0});
  a = args();
  a.lse = wrong_lse.view();
  expect_invalid(a, "lse: dim 1 (heads_q) expected 8 (from q), got 4");
  a = args();
  a.out.dtype = DType::f16;
  expect_invalid(a, "out: expected dtype f32 (like q), got f16");
}

TEST_F(EmptyTensorChecks, NullDataOnlyWhenEmpty) {
  ForwardArgs a = args();
  a.q.data = nullptr;
  a.out.data = nullptr;
  a.lse.data = nullptr;
  EXPECT_TRUE(empty::ok(attention_forward(a, target.options())));
  a.k.data = nullptr;  // k has elements
  expect_invalid(a, "k: data pointer is null");
}

TEST_F(EmptyTensorChecks, MisalignedDataOnEmptyView) {
  ForwardArgs a = args();
  a.q.data = reinterpret_cast<char*>(a.q.data) + 2;
  expect_invalid(a, "q: data pointer is not aligned to its 4-byte elements");
}

TEST_F(EmptyTensorChecks, NoKvHeadsDividesOnlyNoQueryHeads) {
  HostTensor k0 = call.input({2, 7, 0, 64});
  ForwardArgs a = args();
  a.k = a.v = k0.view();
  expect_invalid(a, "k: heads_kv (dim 2) must divide heads_q = 8 (GQA/MQA), got 0");
}

TEST_F(EmptyTensorChecks, ExplicitBackendMustMatchMemory) {
  AttentionOptions options = target.options();
  options.backend = Backend::cuda;
  const Status status = attention_forward(args(), options);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("q: backend cuda needs CUDA memory, got host"), std::string::npos) << status.message();
}

TEST_F(EmptyTensorChecks, VarlenOffsets) {
  HostTensor qv = call.input({0, 8, 64});
  HostTensor kv = call.input({0, 2, 64});
  HostTensor outv = call.output({0, 8, 64});
  HostTensor none = Call::indices({}, {0});
  HostTensor three = Call::indices({3}, {1});
  HostTensor zero = Call::indices({0}, {1});
  ForwardArgs a;
  a.q = qv.view();
  a.k = a.v = kv.view();
  a.out = outv.view();
  a.varlen.cu_seqlens_q = none.view();
  a.varlen.cu_seqlens_k = none.view();
  expect_invalid(a, "varlen.cu_seqlens_q: expected at least 1 entry [batch + 1], got 0");
  a.varlen.cu_seqlens_q = three.view();
  a.varlen.cu_seqlens_k = zero.view();
  expect_invalid(a, "varlen.cu_seqlens_q: expected cu_seqlens_q[0] == 0, got 3");
  a.varlen.cu_seqlens_q = zero.view();
  EXPECT_TRUE(empty::ok(attention_forward(a, target.options())));
}

TEST_F(EmptyTensorChecks, PagedCacheShapes) {
  HostTensor qc = call.input({2, 1, 8, 64});
  HostTensor pages = call.input({4, 0, 2, 64});
  HostTensor outc = call.output({2, 1, 8, 64});
  HostTensor seqlens = Call::indices({0, 0}, {2});
  HostTensor table = Call::indices({0, 1, 2, 3}, {2, 2});
  HostTensor no_columns = Call::indices({}, {2, 0});
  ForwardArgs a;
  a.q = qc.view();
  a.k = a.v = pages.view();
  a.out = outc.view();
  a.kv_cache.seqlens_k = seqlens.view();
  a.kv_cache.block_table = table.view();
  expect_invalid(a, "k: page_size (dim 1 of a paged cache [num_pages, page_size, heads_kv, head_dim]) must be >= 1, "
                    "got shape [4, 0, 2, 64]");
  HostTensor good_pages = call.input({4, 16, 2, 64});
  a.k = a.v = good_pages.view();
  a.kv_cache.block_table = no_columns.view();
  expect_invalid(a, "kv_cache.block_table: expected at least one page per sequence, got shape [2, 0]");
}

// The zero fill of a backward without a (query, key) pair writes every
// logical element and nothing else, in any layout.
TEST(EmptyTensorZeroFill, EveryElementAndNoPadding) {
  const std::vector<MemoryLayout> layouts = {MemoryLayout::row_major(), MemoryLayout::bhsd(), MemoryLayout::padded(8),
                                             MemoryLayout{{2, 0, 1, 3}, 3}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const MemoryLayout& layout : layouts) {
      HostTensor tensor(dtype, {3, 5, 4, 24}, layout);
      tensor.poison();
      ASSERT_TRUE(empty::ok(detail::fill_zeros(tensor.view(), nullptr)));
      EXPECT_TRUE(empty::all_equal(tensor, "tensor", 0.0)) << dtype_name(dtype);
      const std::size_t elements = tensor.bytes().size() / dtype_size(dtype);
      std::int64_t zero_elements = 0;
      for (std::size_t e = 0; e < elements; ++e) {
        bool zero = true;
        for (std::size_t i = 0; i < dtype_size(dtype); ++i) zero = zero && tensor.bytes()[e * dtype_size(dtype) + i] == std::byte{0};
        zero_elements += zero ? 1 : 0;
      }
      EXPECT_EQ(zero_elements, tensor.numel()) << "padding written (" << dtype_name(dtype) << ")";
    }
}

TEST(EmptyMergeChecks, ShapesStillChecked) {
  const Target target = host_target(Backend::cpu, DType::f32, false);
  Call call(target);
  HostTensor a = call.input({0, 3, 2, 64});
  HostTensor b = call.input({0, 3, 2, 32});
  HostTensor lse = call.input({0, 2, 3}, DType::f32);
  HostTensor out = call.output({0, 3, 2, 64});
  MergeArgs args;
  args.out_a = a.view();
  args.out_b = b.view();
  args.lse_a = args.lse_b = args.lse = lse.view();
  args.out = out.view();
  Status status = merge_states(args, Backend::cpu);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("out_b: expected shape [0, 3, 2, 64] (like out_a), got [0, 3, 2, 32]"),
            std::string::npos)
      << status.message();

  HostTensor a0 = call.input({2, 3, 2, 0});
  HostTensor lse0 = call.input({2, 2, 3}, DType::f32);
  HostTensor lse1 = call.input({2, 2, 3}, DType::f32);
  HostTensor lse2 = Call::lse({2, 2, 3});
  HostTensor out0 = call.output({2, 3, 2, 0});
  HostTensor b0 = call.input({2, 3, 2, 0});
  args.out_a = a0.view();
  args.out_b = b0.view();
  args.out = out0.view();
  args.lse_a = lse0.view();
  args.lse_b = lse1.view();
  args.lse = lse2.view();
  status = merge_states(args, Backend::cpu);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("out_a: head_dim (the last dimension of [batch, seqlen, heads, head_dim]) must be >= 1"),
            std::string::npos)
      << status.message();
  EXPECT_TRUE(empty::untouched(lse2, "lse"));
}

}  // namespace
}  // namespace cuflash::test
