// Bad input: every case must fail with a message that names the argument,
// what was expected and what was given, and must leave every output untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "cuflash/cuflash.hpp"
#include "index_copy.hpp"

namespace cuflash {
namespace {

constexpr float kSentinel = 12345.0f;

// A valid call on host f32 tensors that each test breaks in one place.
// Dense: B=2, Sq=40, Sk=48, Hq=4, Hk=2, D=64.
class BadInput : public ::testing::Test {
 protected:
  static constexpr int kBatch = 2, kSeqQ = 40, kSeqK = 48, kHeadsQ = 4, kHeadsKv = 2, kDim = 64;

  std::vector<float> q_data = filled(kBatch * kSeqQ * kHeadsQ * kDim, 0.5f);
  std::vector<float> k_data = filled(kBatch * kSeqK * kHeadsKv * kDim, 0.25f);
  std::vector<float> v_data = filled(kBatch * kSeqK * kHeadsKv * kDim, -0.5f);
  std::vector<float> out_data = filled(q_data.size(), kSentinel);
  std::vector<float> lse_data = filled(kBatch * kHeadsQ * kSeqQ, kSentinel);
  std::vector<float> dout_data = filled(q_data.size(), 0.1f);
  std::vector<float> dq_data = filled(q_data.size(), kSentinel);
  std::vector<float> dk_data = filled(k_data.size(), kSentinel);
  std::vector<float> dv_data = filled(v_data.size(), kSentinel);

  ForwardArgs forward_args() {
    ForwardArgs args;
    args.q = make_view(q_data.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    args.k = make_view(k_data.data(), DType::f32, {kBatch, kSeqK, kHeadsKv, kDim});
    args.v = make_view(v_data.data(), DType::f32, {kBatch, kSeqK, kHeadsKv, kDim});
    args.out = make_view(out_data.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    args.lse = make_view(lse_data.data(), DType::f32, {kBatch, kHeadsQ, kSeqQ});
    return args;
  }

  BackwardArgs backward_args() {
    BackwardArgs args;
    ForwardArgs fwd = forward_args();
    args.q = fwd.q;
    args.k = fwd.k;
    args.v = fwd.v;
    args.out = make_view(dout_data.data() + 0, DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    out_for_backward = filled(q_data.size(), 0.3f);
    args.out = make_view(out_for_backward.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    args.dout = make_view(dout_data.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    lse_for_backward = filled(lse_data.size(), 1.0f);
    args.lse = make_view(lse_for_backward.data(), DType::f32, {kBatch, kHeadsQ, kSeqQ});
    args.dq = make_view(dq_data.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim});
    args.dk = make_view(dk_data.data(), DType::f32, {kBatch, kSeqK, kHeadsKv, kDim});
    args.dv = make_view(dv_data.data(), DType::f32, {kBatch, kSeqK, kHeadsKv, kDim});
    return args;
  }

  static AttentionOptions cpu_options() {
    AttentionOptions options;
    options.backend = Backend::cpu;
    return options;
  }

  static std::vector<float> filled(std::size_t count, float value) { return std::vector<float>(count, value); }

  static bool untouched(const std::vector<float>& data) {
    for (float value : data)
      if (value != kSentinel) return false;
    return true;
  }

  // The call failed with `code`, its message holds every expected fragment,
  // and no output changed.
  void expect_rejected(const Status& status, StatusCode code, const std::vector<std::string>& fragments) {
    EXPECT_EQ(status.code(), code) << status.to_string();
    for (const std::string& fragment : fragments)
      EXPECT_NE(status.message().find(fragment), std::string::npos)
          << "message \"" << status.message() << "\" lacks \"" << fragment << "\"";
    EXPECT_TRUE(untouched(out_data)) << "out was written";
    EXPECT_TRUE(untouched(lse_data)) << "lse was written";
    EXPECT_TRUE(untouched(dq_data)) << "dq was written";
    EXPECT_TRUE(untouched(dk_data)) << "dk was written";
    EXPECT_TRUE(untouched(dv_data)) << "dv was written";
  }

  void expect_invalid_forward(const ForwardArgs& args, const std::vector<std::string>& fragments,
                              const AttentionOptions& options = cpu_options()) {
    expect_rejected(attention_forward(args, options), StatusCode::invalid_argument, fragments);
  }
  void expect_invalid_backward(const BackwardArgs& args, const std::vector<std::string>& fragments,
                               const AttentionOptions& options = cpu_options()) {
    expect_rejected(attention_backward(args, options), StatusCode::invalid_argument, fragments);
  }

  std::vector<float> out_for_backward, lse_for_backward;
};

TEST_F(BadInput, ValidCallsSucceed) {
  ASSERT_TRUE(attention_forward(forward_args(), cpu_options()).ok());
  EXPECT_FALSE(untouched(out_data));
  ASSERT_TRUE(attention_backward(backward_args(), cpu_options()).ok());
}

TEST_F(BadInput, WorkspaceQueriesValidateToo) {
  std::size_t bytes = 1;
  ASSERT_TRUE(forward_workspace_size(forward_args(), cpu_options(), &bytes).ok());
  EXPECT_EQ(bytes, 0u);  // the CPU backend needs no scratch from the caller
  bytes = 1;
  ASSERT_TRUE(backward_workspace_size(backward_args(), cpu_options(), &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  ForwardArgs args = forward_args();
  args.k.shape[3] = 32;
  const Status status = forward_workspace_size(args, cpu_options(), &bytes);
  EXPECT_EQ(status.code(), StatusCode::invalid_argument);
  EXPECT_NE(status.message().find("k: head_dim (last dim) expected 64 (like q), got 32"), std::string::npos)
      << status.message();
}

TEST_F(BadInput, DiagonalOffsetOutOfRange) {
  AttentionOptions options = cpu_options();
  options.diagonal_offset = (std::int64_t{1} << 30) + 1;
  expect_invalid_forward(forward_args(), {"diagonal_offset: expected |offset| <= 2^30, got 1073741825"}, options);
  options.diagonal_offset = -(std::int64_t{1} << 31);
  expect_invalid_backward(backward_args(), {"diagonal_offset: expected |offset| <= 2^30"}, options);
}

TEST_F(BadInput, MissingQ) {
  ForwardArgs args = forward_args();
  args.q = {};
  expect_invalid_forward(args, {"q: required but not given"});
}

TEST_F(BadInput, WrongRank) {
  ForwardArgs args = forward_args();
  args.q = make_view(q_data.data(), DType::f32, {kBatch * kSeqQ, kHeadsQ, kDim});
  expect_invalid_forward(args, {"q: expected rank 4 [batch, seqlen_q, heads_q, head_dim], got rank 3 [80, 4, 64]"});
}

TEST_F(BadInput, NullData) {
  ForwardArgs args = forward_args();
  args.v.data = nullptr;
  expect_invalid_forward(args, {"v: data pointer is null"});
}

TEST_F(BadInput, NonFloatDtype) {
  ForwardArgs args = forward_args();
  args.q.dtype = DType::i32;
  expect_invalid_forward(args, {"q: expected dtype f32, f16 or bf16, got i32"});
}

TEST_F(BadInput, MixedDtypes) {
  ForwardArgs args = forward_args();
  args.k.dtype = DType::bf16;
  expect_invalid_forward(args, {"k: expected dtype f32 (same as q), got bf16"});
}

TEST_F(BadInput, LastDimNotContiguous) {
  ForwardArgs args = forward_args();
  args.q = make_strided_view(q_data.data(), DType::f32, {kBatch, kSeqQ, kHeadsQ, kDim / 2},
                             {kSeqQ * kHeadsQ * kDim, kHeadsQ * kDim, kDim, 2});
  expect_invalid_forward(args, {"q: last dimension must be contiguous (stride 1), got stride 2"});
}

TEST_F(BadInput, NegativeStride) {
  ForwardArgs args = forward_args();
  args.k.strides[1] = -args.k.strides[1];
  expect_invalid_forward(args, {"k: strides must be non-negative", "got strides [6144, -128, 64, 1]"});
}

// Zero extents are valid (an empty result: cpu/empty_tensors_test.cpp), but a
// head of no features is not.
TEST_F(BadInput, ZeroHeadDim) {
  ForwardArgs args = forward_args();
  args.q.shape[3] = 0;
  expect_invalid_forward(args, {"q: head_dim (the last dimension of [batch, seqlen_q, heads_q, head_dim]) must be >= 1",
                                "got shape [2, 40, 4, 0]"});
}

TEST_F(BadInput, DimensionBeyondInt32) {
  ForwardArgs args = forward_args();
  args.k.shape[1] = std::int64_t{1} << 31;
  expect_invalid_forward(args, {"k: every dimension must be in [0, 2^31), got shape [2, 2147483648, 2, 64]"});
}

TEST_F(BadInput, MisalignedPointer) {
  ForwardArgs args = forward_args();
  args.k.data = reinterpret_cast<char*>(k_data.data()) + 2;
  expect_invalid_forward(args, {"k: data pointer is not aligned to its 4-byte elements"});
}

TEST_F(BadInput, HeadDimMismatch) {
  ForwardArgs args = forward_args();
  args.k.shape[3] = 32;
  args.v.shape[3] = 32;
  expect_invalid_forward(args, {"k: head_dim (last dim) expected 64 (like q), got 32"});
}

TEST_F(BadInput, HeadsQNotMultipleOfHeadsKv) {
  ForwardArgs args = forward_args();
  args.k = make_view(k_data.data(), DType::f32, {kBatch, 16, 3, kDim});
  args.v = make_view(v_data.data(), DType::f32, {kBatch, 16, 3, kDim});
  expect_invalid_forward(args, {"k: heads_kv (dim 2) must divide heads_q = 4 (GQA/MQA), got 3"});
}

TEST_F(BadInput, BatchMismatch) {
  ForwardArgs args = forward_args();
  args.k = make_view(k_data.data(), DType::f32, {1, kSeqK, kHeadsKv, kDim});
  args.v = make_view(v_data.data(), DType::f32, {1, kSeqK, kHeadsKv, kDim});
  expect_invalid_forward(args, {"k: dim 0 (batch) expected 2 (like q), got 1"});
}

TEST_F(BadInput, ValueShapeDiffersFromKey) {
  ForwardArgs args = forward_args();
  args.v.shape[1] = 40;
  expect_invalid_forward(args, {"v: expected shape [2, 48, 2, 64] (like k), got [2, 40, 2, 64]"});
}

TEST_F(BadInput, OutputShape) {
  ForwardArgs args = forward_args();
  args.out.shape[1] = 39;
  expect_invalid_forward(args, {"out: expected shape [2, 40, 4, 64] (like q), got [2, 39, 4, 64]"});
}

TEST_F(BadInput, OutputDtype) {
  ForwardArgs args = forward_args();
  args.out.dtype = DType::f16;
  expect_invalid_forward(args, {"out: expected dtype f32 (like q), got f16"});
}

TEST_F(BadInput, DeviceMismatch) {
  ForwardArgs args = forward_args();
  args.k.device = Device::cuda(0);
  expect_invalid_forward(args, {"k: expected device host (same as q), got cuda:0"});
}

TEST_F(BadInput, LseDtype) {
  ForwardArgs args = forward_args();
  args.lse.dtype = DType::f16;
  expect_invalid_forward(args, {"lse: expected dtype f32 (log-sum-exp is always float32), got f16"});
}

TEST_F(BadInput, LseShape) {
  ForwardArgs args = forward_args();
  args.lse.shape[2] = kSeqQ - 1;
  expect_invalid_forward(args, {"lse: dim 2 (seqlen_q) expected 40 (from q), got 39"});
}

TEST_F(BadInput, OutputAliasesInput) {
  ForwardArgs args = forward_args();
  args.out.data = q_data.data();
  expect_invalid_forward(args, {"out: overlaps q in memory; an output may not alias an input"});
}

TEST_F(BadInput, LseOverlapsOutput) {
  ForwardArgs args = forward_args();
  args.lse.data = out_data.data() + 8;
  expect_invalid_forward(args, {"out: overlaps lse in memory; outputs may not alias each other"});
}

TEST_F(BadInput, GradientAliasesUpstreamGradient) {
  BackwardArgs args = backward_args();
  args.dq.data = dout_data.data();
  expect_invalid_backward(args, {"dq: overlaps dout in memory"});
}

TEST_F(BadInput, SelfOverlappingOutput) {
  BackwardArgs args = backward_args();
  args.dk.strides[1] = 0;  // every key row would land on the same memory
  expect_invalid_backward(args, {"dk: output elements overlap in memory", "strides [6144, 0, 64, 1]"});
}

TEST_F(BadInput, BackwardNeedsLse) {
  BackwardArgs args = backward_args();
  args.lse = {};
  expect_invalid_backward(args, {"lse: required but not given"});
}

TEST_F(BadInput, GradientShape) {
  BackwardArgs args = backward_args();
  args.dv.shape[2] = 1;
  expect_invalid_backward(args, {"dv: expected shape [2, 48, 2, 64] (like v), got [2, 48, 1, 64]"});
}

TEST_F(BadInput, SoftmaxScaleNotFinite) {
  AttentionOptions options = cpu_options();
  options.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_invalid_forward(forward_args(), {"softmax_scale: expected a finite number, got nan"}, options);
}

TEST_F(BadInput, WindowBelowMinusOne) {
  AttentionOptions options = cpu_options();
  options.window_left = -2;
  expect_invalid_forward(forward_args(), {"window_left: expected -1 (unbounded) or >= 0, got -2"}, options);
  options.window_left = -1;
  options.window_right = -5;
  expect_invalid_forward(forward_args(), {"window_right: expected -1 (unbounded) or >= 0, got -5"}, options);
}

TEST_F(BadInput, NegativeSoftcap) {
  AttentionOptions options = cpu_options();
  options.softcap = -1.0f;
  expect_invalid_forward(forward_args(), {"softcap: expected 0 (off) or a finite positive number, got -1"}, options);
}

TEST_F(BadInput, AlibiShape) {
  std::vector<float> slopes(3, 0.5f);
  ForwardArgs args = forward_args();
  args.alibi_slopes = make_view(slopes.data(), DType::f32, {3});
  expect_invalid_forward(args, {"alibi_slopes: dim 0 (heads_q) expected 4 (from q), got 3"});
}

TEST_F(BadInput, AlibiDtype) {
  std::vector<float> slopes(kBatch * kHeadsQ, 0.5f);
  ForwardArgs args = forward_args();
  args.alibi_slopes = make_view(slopes.data(), DType::f16, {kBatch, kHeadsQ});
  expect_invalid_forward(args, {"alibi_slopes: expected dtype f32 (slopes are float32), got f16"});
}

TEST_F(BadInput, HeadDimTheBackendCannotTake) {
  std::vector<float> big_q(1 * 4 * 1 * 320, 0.5f), big_k(big_q), big_v(big_q), big_out(big_q.size(), kSentinel);
  ForwardArgs args;
  args.q = make_view(big_q.data(), DType::f32, {1, 4, 1, 320});
  args.k = make_view(big_k.data(), DType::f32, {1, 4, 1, 320});
  args.v = make_view(big_v.data(), DType::f32, {1, 4, 1, 320});
  args.out = make_view(big_out.data(), DType::f32, {1, 4, 1, 320});
  const Status status = attention_forward(args, cpu_options());
  EXPECT_EQ(status.code(), StatusCode::unsupported) << status.to_string();
  EXPECT_NE(status.message().find("head_dim: backend cpu supports 1..256, got 320"), std::string::npos)
      << status.message();
  for (float value : big_out) ASSERT_EQ(value, kSentinel);
}

TEST_F(BadInput, CpuBackendWithGpuTensors) {
  // Host memory labelled as GPU memory: rejected before anything reads it.
  ForwardArgs args = forward_args();
  for (TensorView* view : {&args.q, &args.k, &args.v, &args.out, &args.lse}) view->device = Device::cuda(0);
  const Status status = attention_forward(args, cpu_options());
  if (detail::built_with_cuda()) {
    expect_rejected(status, StatusCode::invalid_argument, {"q: backend cpu needs host memory, got cuda:0"});
  } else {
    expect_rejected(status, StatusCode::unsupported, {"q: is in CUDA memory, but this build of cuflash has no CUDA support"});
  }
}

TEST_F(BadInput, GpuBackendWithHostTensors) {
  AttentionOptions options = cpu_options();
  options.backend = Backend::cuda;
  expect_invalid_forward(forward_args(), {"q: backend cuda needs CUDA memory, got host"}, options);
}

// Varlen: total_q = 60 rows, total_k = 80 rows, three sequences.
class BadVarlen : public BadInput {
 protected:
  std::vector<std::int32_t> cu_q = {0, 10, 30, 60};
  std::vector<std::int32_t> cu_k = {0, 20, 50, 80};

  ForwardArgs varlen_args() {
    ForwardArgs args;
    args.q = make_view(q_data.data(), DType::f32, {60, kHeadsQ, kDim});
    args.k = make_view(k_data.data(), DType::f32, {80, kHeadsKv, kDim});
    args.v = make_view(v_data.data(), DType::f32, {80, kHeadsKv, kDim});
    args.out = make_view(out_data.data(), DType::f32, {60, kHeadsQ, kDim});
    args.lse = make_view(lse_data.data(), DType::f32, {kHeadsQ, 60});
    args.varlen.cu_seqlens_q = make_view(cu_q.data(), DType::i32, {4});
    args.varlen.cu_seqlens_k = make_view(cu_k.data(), DType::i32, {4});
    args.varlen.max_seqlen_q = 30;
    args.varlen.max_seqlen_k = 30;
    return args;
  }
};

TEST_F(BadVarlen, ValidCallSucceeds) { ASSERT_TRUE(attention_forward(varlen_args(), cpu_options()).ok()); }

TEST_F(BadVarlen, CuSeqlensDtype) {
  ForwardArgs args = varlen_args();
  args.varlen.cu_seqlens_q.dtype = DType::f32;
  expect_invalid_forward(args, {"varlen.cu_seqlens_q: expected dtype i32 (index tensors are int32), got f32"});
}

TEST_F(BadVarlen, CuSeqlensNotMonotone) {
  cu_q = {0, 10, 5, 60};
  expect_invalid_forward(varlen_args(), {"varlen.cu_seqlens_q: must be non-decreasing, but cu_seqlens_q[2] = 5 < cu_seqlens_q[1] = 10"});
}

TEST_F(BadVarlen, CuSeqlensNotStartingAtZero) {
  cu_k = {1, 20, 50, 80};
  expect_invalid_forward(varlen_args(), {"varlen.cu_seqlens_k: expected cu_seqlens_k[0] == 0, got 1"});
}

TEST_F(BadVarlen, CuSeqlensPastTheTensor) {
  cu_k = {0, 20, 50, 90};
  expect_invalid_forward(varlen_args(), {"varlen.cu_seqlens_k: cu_seqlens_k[3] = 90 exceeds the 80 packed rows of k"});
}

TEST_F(BadVarlen, CuSeqlensSizesDiffer) {
  ForwardArgs args = varlen_args();
  args.varlen.cu_seqlens_k.shape[0] = 3;
  expect_invalid_forward(args, {"varlen.cu_seqlens_k: dim 0 (batch + 1) expected 4 (like cu_seqlens_q), got 3"});
}

TEST_F(BadVarlen, MaxSeqlenTooSmall) {
  ForwardArgs args = varlen_args();
  args.varlen.max_seqlen_q = 20;
  expect_invalid_forward(args, {"varlen.max_seqlen_q: expected >= 30 (the longest sequence in cu_seqlens_q), got 20"});
}

TEST_F(BadVarlen, VarlenLseShape) {
  ForwardArgs args = varlen_args();
  args.lse = make_view(lse_data.data(), DType::f32, {kBatch, kHeadsQ, 30});
  expect_invalid_forward(args, {"lse: expected rank 2 [heads_q, total_q], got rank 3"});
}

TEST_F(BadVarlen, VarlenAndKvCacheTogether) {
  std::vector<std::int32_t> seqlens = {1, 2, 3};
  ForwardArgs args = varlen_args();
  args.kv_cache.seqlens_k = make_view(seqlens.data(), DType::i32, {3});
  expect_invalid_forward(args, {"varlen, kv_cache: a call takes either cu_seqlens (varlen) or a KV cache, not both"});
}

// Varlen queries (BadVarlen's) over keys in a paged cache (flash-attn's paged
// prefill): 8 pages of 16 keys, 2 pages per sequence (32 keys at most);
// cu_seqlens_k {0, 10, 40, 70} counts 10, 30 and 30 keys, which are not packed
// rows of k (so 70 > the 8 rows of k's dim 0 is fine).
class BadPagedVarlen : public BadVarlen {
 protected:
  static constexpr int kPages = 8, kPageSize = 16, kMaxPages = 2;
  std::vector<float> cache_k = filled(kPages * kPageSize * kHeadsKv * kDim, 0.25f);
  std::vector<float> cache_v = filled(kPages * kPageSize * kHeadsKv * kDim, -0.5f);
  std::vector<std::int32_t> block_table = {5, 2, 7, 0, 3, 6};

  BadPagedVarlen() { cu_k = {0, 10, 40, 70}; }

  ForwardArgs paged_args() {
    ForwardArgs args = varlen_args();
    args.k = make_view(cache_k.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
    args.v = make_view(cache_v.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
    args.kv_cache.block_table = make_view(block_table.data(), DType::i32, {3, kMaxPages});
    return args;
  }
};

TEST_F(BadPagedVarlen, ValidCallSucceeds) {
  ASSERT_TRUE(attention_forward(paged_args(), cpu_options()).ok());
  EXPECT_FALSE(untouched(out_data));
}

TEST_F(BadPagedVarlen, EntryPastASequencesKeysIsNotRead) {
  block_table[1] = 99;  // sequence 0 has 10 keys: its second page is never read
  ASSERT_TRUE(attention_forward(paged_args(), cpu_options()).ok());
}

TEST_F(BadPagedVarlen, EntryOutOfRange) {
  block_table[3] = 8;  // sequence 1, page 1: its keys 16..29
  expect_invalid_forward(paged_args(), {"kv_cache.block_table: block_table[1][1] = 8 is out of range [0, 8) (pages in k)"});
}

TEST_F(BadPagedVarlen, NegativeEntry) {
  block_table[0] = -1;
  expect_invalid_forward(paged_args(), {"kv_cache.block_table: block_table[0][0] = -1 is out of range [0, 8)"});
}

TEST_F(BadPagedVarlen, SequenceLongerThanItsPages) {
  cu_k = {0, 10, 43, 73};
  ForwardArgs args = paged_args();
  args.varlen.max_seqlen_k = 40;
  expect_invalid_forward(args, {"kv_cache.block_table: sequence 1 has 33 keys (cu_seqlens_k), more than its 2 pages x "
                                "page_size 16 hold; expected at least 3 columns"});
}

TEST_F(BadPagedVarlen, CuSeqlensKStillChecked) {
  cu_k = {0, 10, 5, 70};
  expect_invalid_forward(paged_args(), {"varlen.cu_seqlens_k: must be non-decreasing"});
}

TEST_F(BadPagedVarlen, BlockTableRowsNotTheBatch) {
  ForwardArgs args = paged_args();
  args.kv_cache.block_table = make_view(block_table.data(), DType::i32, {2, 3});
  expect_invalid_forward(args, {"kv_cache.block_table: dim 0 (batch) expected 3"});
}

TEST_F(BadPagedVarlen, BlockTableDtype) {
  ForwardArgs args = paged_args();
  args.kv_cache.block_table.dtype = DType::f32;
  expect_invalid_forward(args, {"kv_cache.block_table: expected dtype i32 (index tensors are int32), got f32"});
}

TEST_F(BadPagedVarlen, PackedKeysWithABlockTable) {
  ForwardArgs args = paged_args();
  args.k = make_view(k_data.data(), DType::f32, {80, kHeadsKv, kDim});
  args.v = make_view(v_data.data(), DType::f32, {80, kHeadsKv, kDim});
  expect_invalid_forward(args, {"k: expected rank 4 [num_pages, page_size, heads_kv, head_dim], got rank 3"});
}

TEST_F(BadPagedVarlen, SeqlensKNotWithVarlen) {
  std::vector<std::int32_t> seqlens = {10, 30, 30};
  ForwardArgs args = paged_args();
  args.kv_cache.seqlens_k = make_view(seqlens.data(), DType::i32, {3});
  expect_invalid_forward(args, {"kv_cache.seqlens_k: not with varlen"});
}

TEST_F(BadPagedVarlen, NoAppendWithVarlen) {
  std::vector<float> new_kv = filled(3 * 2 * kHeadsKv * kDim, 0.5f);
  ForwardArgs args = paged_args();
  args.kv_cache.k_new = make_view(new_kv.data(), DType::f32, {3, 2, kHeadsKv, kDim});
  args.kv_cache.v_new = make_view(new_kv.data(), DType::f32, {3, 2, kHeadsKv, kDim});
  expect_invalid_forward(args, {"kv_cache.k_new: not with varlen"});
  EXPECT_TRUE(std::all_of(cache_k.begin(), cache_k.end(), [](float x) { return x == 0.25f; }));
}

TEST_F(BadPagedVarlen, BackwardRefusesTheBlockTable) {
  BackwardArgs args = backward_args();
  const ForwardArgs fwd = paged_args();
  args.q = fwd.q;
  args.k = fwd.k;
  args.v = fwd.v;
  args.varlen = fwd.varlen;
  args.kv_cache.block_table = fwd.kv_cache.block_table;
  args.out = make_view(out_for_backward.data(), DType::f32, {60, kHeadsQ, kDim});
  args.dout = make_view(dout_data.data(), DType::f32, {60, kHeadsQ, kDim});
  args.lse = make_view(lse_for_backward.data(), DType::f32, {kHeadsQ, 60});
  args.dq = make_view(dq_data.data(), DType::f32, {60, kHeadsQ, kDim});
  std::vector<float> dk_pages = filled(cache_k.size(), kSentinel), dv_pages = filled(cache_v.size(), kSentinel);
  args.dk = make_view(dk_pages.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  args.dv = make_view(dv_pages.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  expect_invalid_backward(args, {"kv_cache.block_table: not in a varlen backward"});
  EXPECT_TRUE(untouched(dk_pages) && untouched(dv_pages)) << "dk/dv were written";
}

// Paged cache: 8 pages of 16 keys, 4 pages per sequence (capacity 64), B=2, Sq=40.
class BadPaged : public BadInput {
 protected:
  static constexpr int kPages = 8, kPageSize = 16, kMaxPages = 4, kNew = 5;
  std::vector<float> cache_k = filled(kPages * kPageSize * kHeadsKv * kDim, kSentinel);
  std::vector<float> cache_v = filled(kPages * kPageSize * kHeadsKv * kDim, kSentinel);
  std::vector<float> new_k = filled(kBatch * kNew * kHeadsKv * kDim, 0.5f);
  std::vector<float> new_v = filled(kBatch * kNew * kHeadsKv * kDim, 0.5f);
  std::vector<std::int32_t> block_table = {3, 1, 6, 0, 2, 7, 4, 5};
  std::vector<std::int32_t> seqlens = {20, 50};

  ForwardArgs paged_args() {
    ForwardArgs args = forward_args();
    args.k = make_view(cache_k.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
    args.v = make_view(cache_v.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
    args.kv_cache.seqlens_k = make_view(seqlens.data(), DType::i32, {kBatch});
    args.kv_cache.block_table = make_view(block_table.data(), DType::i32, {kBatch, kMaxPages});
    args.kv_cache.k_new = make_view(new_k.data(), DType::f32, {kBatch, kNew, kHeadsKv, kDim});
    args.kv_cache.v_new = make_view(new_v.data(), DType::f32, {kBatch, kNew, kHeadsKv, kDim});
    return args;
  }

  void expect_cache_untouched() {
    EXPECT_TRUE(untouched(cache_k)) << "the K cache was written";
    EXPECT_TRUE(untouched(cache_v)) << "the V cache was written";
  }
};

TEST_F(BadPaged, ValidCallSucceedsAndAppends) {
  ASSERT_TRUE(attention_forward(paged_args(), cpu_options()).ok());
  EXPECT_FALSE(untouched(cache_k));
}

TEST_F(BadPaged, BlockTableEntryOutOfRange) {
  block_table[6] = 9;  // sequence 1, page 2: holds keys 32..47 of its 55
  expect_invalid_forward(paged_args(), {"kv_cache.block_table: block_table[1][2] = 9 is out of range [0, 8) (pages in k)"});
  expect_cache_untouched();
}

TEST_F(BadPaged, BlockTableDtype) {
  ForwardArgs args = paged_args();
  args.kv_cache.block_table.dtype = DType::f32;
  expect_invalid_forward(args, {"kv_cache.block_table: expected dtype i32 (index tensors are int32), got f32"});
  expect_cache_untouched();
}

TEST_F(BadPaged, NegativeCacheLength) {
  seqlens[0] = -1;
  expect_invalid_forward(paged_args(), {"kv_cache.seqlens_k: seqlens_k[0] = -1 is negative"});
  expect_cache_untouched();
}

TEST_F(BadPaged, CacheLengthBeyondTableCapacity) {
  seqlens[1] = 70;
  expect_invalid_forward(paged_args(), {"kv_cache.seqlens_k: seqlens_k[1] = 70 exceeds the capacity of 64 keys per sequence (4 pages x page_size 16)"});
  expect_cache_untouched();
}

TEST_F(BadPaged, AppendOverflowsTheCache) {
  seqlens[1] = 60;
  expect_invalid_forward(paged_args(), {"kv_cache.k_new: appending 5 keys to sequence 1 (holding 60) overflows its capacity of 64 keys"});
  expect_cache_untouched();
}

// Sequence 1's last page becomes sequence 0's page 1: its keys 50..54 go to
// slots 2..6 of page 1, where sequence 0's keys 20..24 go to slots 4..8.
TEST_F(BadPaged, TwoAppendsIntoTheSameSlots) {
  block_table[7] = 1;
  expect_invalid_forward(paged_args(), {"kv_cache.block_table: sequence 1 (block_table[1][3]) and sequence 0 "
                                        "(block_table[0][1]) both append into page 1 slot 4; appended keys must go "
                                        "to distinct cache slots"});
  expect_cache_untouched();
}

// A page two sequences share is fine as long as their appends use different slots.
TEST_F(BadPaged, SharedPageWithDisjointAppendsIsValid) {
  block_table[7] = 1;
  seqlens[1] = 57;  // keys 57..61: slots 9..13 of page 1, after sequence 0's 4..8
  ASSERT_TRUE(attention_forward(paged_args(), cpu_options()).ok());
}

TEST_F(BadPaged, KeyAppendWithoutValues) {
  ForwardArgs args = paged_args();
  args.kv_cache.v_new = {};
  expect_invalid_forward(args, {"kv_cache.v_new: required with k_new but not given"});
  expect_cache_untouched();
}

TEST_F(BadPaged, SeqlensMissing) {
  ForwardArgs args = paged_args();
  args.kv_cache.seqlens_k = {};
  expect_invalid_forward(args, {"kv_cache.seqlens_k: required but not given"});
  expect_cache_untouched();
}

TEST_F(BadPaged, OutputAliasesTheCacheBeingAppended) {
  ForwardArgs args = paged_args();
  args.lse.data = cache_v.data() + 64;  // lse (320 floats) lies inside the V cache (16384)
  expect_invalid_forward(args, {"lse: overlaps v in memory; outputs may not alias each other"});
  expect_cache_untouched();
}

TEST_F(BadPaged, BackwardRejectsAppend) {
  BackwardArgs args = backward_args();
  args.k = make_view(cache_k.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  args.v = make_view(cache_v.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  args.dk = make_view(dk_data.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  args.dv = make_view(dv_data.data(), DType::f32, {kPages, kPageSize, kHeadsKv, kDim});
  args.kv_cache.seqlens_k = make_view(seqlens.data(), DType::i32, {kBatch});
  args.kv_cache.block_table = make_view(block_table.data(), DType::i32, {kBatch, kMaxPages});
  args.kv_cache.k_new = make_view(new_k.data(), DType::f32, {kBatch, kNew, kHeadsKv, kDim});
  args.kv_cache.v_new = make_view(new_v.data(), DType::f32, {kBatch, kNew, kHeadsKv, kDim});
  expect_invalid_backward(args, {"kv_cache.k_new: appends are forward-only"});
}

// BadPaged's cache seen as a contiguous one, [B=2, capacity 64, Hk, D], with
// its 5 keys to append, a leftpad and a GPT-NeoX rotary embedding of 32 of the
// 64 columns, that each test breaks in one place.
class BadCacheOptions : public BadPaged {
 protected:
  static constexpr int kCapacity = kPages * kPageSize / kBatch, kRotaryPairs = 16;
  std::vector<std::int32_t> leftpad = {3, 50};
  std::vector<float> cos = filled(2 * kCapacity * kRotaryPairs, 0.5f);  // room for 128 rows
  std::vector<float> sin = filled(2 * kCapacity * kRotaryPairs, 0.5f);

  ForwardArgs cache_args(int rotary_rows = kCapacity) {
    ForwardArgs args = paged_args();
    args.k = make_view(cache_k.data(), DType::f32, {kBatch, kCapacity, kHeadsKv, kDim});
    args.v = make_view(cache_v.data(), DType::f32, {kBatch, kCapacity, kHeadsKv, kDim});
    args.kv_cache.block_table = {};
    args.kv_cache.leftpad = make_view(leftpad.data(), DType::i32, {kBatch});
    args.kv_cache.rotary_cos = make_view(cos.data(), DType::f32, {rotary_rows, kRotaryPairs});
    args.kv_cache.rotary_sin = make_view(sin.data(), DType::f32, {rotary_rows, kRotaryPairs});
    return args;
  }
};

TEST_F(BadCacheOptions, ValidCallSucceedsAndAppends) {
  ASSERT_TRUE(attention_forward(cache_args(), cpu_options()).ok());
  EXPECT_FALSE(untouched(cache_k));
}

TEST_F(BadCacheOptions, LeftpadBeyondTheCachedKeysOfAPagedCache) {
  ForwardArgs args = paged_args();
  leftpad[0] = 1000;
  args.kv_cache.leftpad = make_view(leftpad.data(), DType::i32, {kBatch});
  expect_invalid_forward(args, {"kv_cache.leftpad: leftpad[0] = 1000"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, LeftpadBeyondTheCachedKeys) {
  leftpad[1] = 51;
  expect_invalid_forward(cache_args(), {"kv_cache.leftpad: leftpad[1] = 51 exceeds seqlens_k[1] = 50"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, NegativeLeftpad) {
  leftpad[0] = -1;
  expect_invalid_forward(cache_args(), {"kv_cache.leftpad: leftpad[0] = -1 is negative"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, LeftpadShapeAndDtype) {
  ForwardArgs args = cache_args();
  args.kv_cache.leftpad.shape[0] = 1;
  expect_invalid_forward(args, {"kv_cache.leftpad: dim 0 (batch) expected 2 (from q), got 1"});
  args = cache_args();
  args.kv_cache.leftpad.dtype = DType::f32;
  expect_invalid_forward(args, {"kv_cache.leftpad: expected dtype i32 (index tensors are int32), got f32"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, LeftpadAloneIsAKvCacheCallWithoutSeqlens) {
  ForwardArgs args = forward_args();
  args.kv_cache.leftpad = make_view(leftpad.data(), DType::i32, {kBatch});
  expect_invalid_forward(args, {"kv_cache.seqlens_k: required but not given"});
}

TEST_F(BadCacheOptions, RotarySinWithoutCos) {
  ForwardArgs args = cache_args();
  args.kv_cache.rotary_cos = {};
  expect_invalid_forward(args, {"kv_cache.rotary_cos: required with rotary_sin but not given"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, RotaryDtypeUnlikeQ) {
  ForwardArgs args = cache_args();
  args.kv_cache.rotary_sin.dtype = DType::bf16;
  expect_invalid_forward(args, {"kv_cache.rotary_sin: expected dtype f32 (like q), got bf16"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, RotaryTablesOfDifferentShapes) {
  ForwardArgs args = cache_args();
  args.kv_cache.rotary_sin = make_view(sin.data(), DType::f32, {kCapacity, 8});
  expect_invalid_forward(args, {"kv_cache.rotary_sin: dim 1 (rotary_dim / 2) expected 16 (like rotary_cos), got 8"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, RotaryDimBeyondHeadDim) {
  ForwardArgs args = cache_args();
  args.kv_cache.rotary_cos = make_view(cos.data(), DType::f32, {kCapacity, 33});
  args.kv_cache.rotary_sin = make_view(sin.data(), DType::f32, {kCapacity, 33});
  expect_invalid_forward(args, {"kv_cache.rotary_cos: rotary_dim = 2 x 33 = 66 exceeds head_dim 64"});
  expect_cache_untouched();
}

// Positions reach the cache's capacity; with queries at their own positions
// (causal) the last of 40 queries after 5 appended keys reaches 35 further.
TEST_F(BadCacheOptions, RotaryTableShorterThanThePositions) {
  expect_invalid_forward(cache_args(kCapacity - 1),
                         {"kv_cache.rotary_cos: expected at least 64 rows (seqlen_ro >= the cache's capacity), got "
                          "shape [63, 16]"});
  AttentionOptions causal = cpu_options();
  causal.causal = true;
  expect_invalid_forward(cache_args(kCapacity + kSeqQ - kNew - 1), {"kv_cache.rotary_cos: expected at least 99 rows"},
                         causal);
  ASSERT_TRUE(attention_forward(cache_args(kCapacity + kSeqQ - kNew), causal).ok());
}

TEST_F(BadCacheOptions, RotaryWithoutAnAppend) {
  ForwardArgs args = cache_args();
  args.kv_cache.k_new = {};
  args.kv_cache.v_new = {};
  expect_invalid_forward(args, {"kv_cache.rotary_cos: needs kv_cache.k_new/v_new"});
  expect_cache_untouched();
}

TEST_F(BadCacheOptions, RotaryInABackward) {
  std::vector<float> cache_dk = filled(cache_k.size(), kSentinel), cache_dv = filled(cache_v.size(), kSentinel);
  BackwardArgs args = backward_args();
  const ForwardArgs forward = cache_args();
  args.k = forward.k;
  args.v = forward.v;
  args.dk = make_view(cache_dk.data(), DType::f32, {kBatch, kCapacity, kHeadsKv, kDim});
  args.dv = make_view(cache_dv.data(), DType::f32, {kBatch, kCapacity, kHeadsKv, kDim});
  args.kv_cache.seqlens_k = forward.kv_cache.seqlens_k;
  args.kv_cache.rotary_cos = forward.kv_cache.rotary_cos;
  args.kv_cache.rotary_sin = forward.kv_cache.rotary_sin;
  expect_invalid_backward(args, {"kv_cache.rotary_cos: the rotary embedding is part of a forward's append"});
  EXPECT_TRUE(untouched(cache_dk) && untouched(cache_dv)) << "dk/dv were written";
}

// q, k and v sliced from one packed [B, S, 3, H, D] tensor interleave without
// sharing an element; so do dq, dk, dv written into one packed gradient.
TEST(PackedViews, InterleavedQkvAndGradientsAreNotAliases) {
  constexpr int kB = 2, kS = 24, kH = 2, kD = 32;
  std::vector<float> qkv(kB * kS * 3 * kH * kD);
  for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = std::sin(0.37f * static_cast<float>(i));
  std::vector<float> out(kB * kS * kH * kD), lse(kB * kH * kS), dout(out.size(), 0.25f);
  std::vector<float> dqkv(qkv.size(), kSentinel);
  auto slice = [&](std::vector<float>& packed, int which) {
    return make_strided_view(packed.data() + which * kH * kD, DType::f32, {kB, kS, kH, kD},
                             {kS * 3 * kH * kD, 3 * kH * kD, kD, 1});
  };
  AttentionOptions options;
  options.backend = Backend::cpu;
  ForwardArgs forward;
  forward.q = slice(qkv, 0);
  forward.k = slice(qkv, 1);
  forward.v = slice(qkv, 2);
  forward.out = make_view(out.data(), DType::f32, {kB, kS, kH, kD});
  forward.lse = make_view(lse.data(), DType::f32, {kB, kH, kS});
  ASSERT_TRUE(attention_forward(forward, options).ok());

  BackwardArgs backward;
  backward.q = forward.q;
  backward.k = forward.k;
  backward.v = forward.v;
  backward.out = forward.out;
  backward.lse = forward.lse;
  backward.dout = make_view(dout.data(), DType::f32, {kB, kS, kH, kD});
  backward.dq = slice(dqkv, 0);
  backward.dk = slice(dqkv, 1);
  backward.dv = slice(dqkv, 2);
  const Status status = attention_backward(backward, options);
  ASSERT_TRUE(status.ok()) << status.to_string();
  for (float value : dqkv) ASSERT_NE(value, kSentinel) << "a packed gradient element was not written";

  // Shifted by one element, dk now shares memory with dq.
  backward.dk.data = dqkv.data() + kH * kD - 1;
  const Status overlap = attention_backward(backward, options);
  EXPECT_EQ(overlap.code(), StatusCode::invalid_argument);
  EXPECT_NE(overlap.message().find("dq: overlaps dk in memory"), std::string::npos) << overlap.message();
}

class BadMerge : public ::testing::Test {
 protected:
  static constexpr int kB = 2, kS = 3, kH = 4, kD = 8;
  std::vector<float> out_a = std::vector<float>(kB * kS * kH * kD, 1.0f), out_b = out_a;
  std::vector<float> lse_a = std::vector<float>(kB * kH * kS, 0.0f), lse_b = lse_a;
  std::vector<float> out = std::vector<float>(out_a.size(), kSentinel), lse = std::vector<float>(lse_a.size(), kSentinel);

  MergeArgs args() {
    MergeArgs merge;
    merge.out_a = make_view(out_a.data(), DType::f32, {kB, kS, kH, kD});
    merge.out_b = make_view(out_b.data(), DType::f32, {kB, kS, kH, kD});
    merge.lse_a = make_view(lse_a.data(), DType::f32, {kB, kH, kS});
    merge.lse_b = make_view(lse_b.data(), DType::f32, {kB, kH, kS});
    merge.out = make_view(out.data(), DType::f32, {kB, kS, kH, kD});
    merge.lse = make_view(lse.data(), DType::f32, {kB, kH, kS});
    return merge;
  }

  void expect_invalid(const MergeArgs& merge, const std::string& fragment) {
    const Status status = merge_states(merge, Backend::cpu);
    EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
    EXPECT_NE(status.message().find(fragment), std::string::npos) << status.message();
    for (float value : out) ASSERT_EQ(value, kSentinel);
    for (float value : lse) ASSERT_EQ(value, kSentinel);
  }
};

TEST_F(BadMerge, LseShape) {
  MergeArgs merge = args();
  merge.lse_b.shape[2] = 2;
  expect_invalid(merge, "lse_b: dim 2 (seqlen) expected 3 (from out_a), got 2");
}

TEST_F(BadMerge, OutputAliasesOtherSide) {
  MergeArgs merge = args();
  merge.out = merge.out_b;
  expect_invalid(merge, "out: overlaps out_b in memory; an output may not alias an input");
}

TEST_F(BadMerge, InPlaceIntoSideAIsAllowed) {
  MergeArgs merge = args();
  merge.out = merge.out_a;
  merge.lse = merge.lse_a;
  const Status status = merge_states(merge, Backend::cpu);
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_NEAR(lse_a[0], std::log(2.0f), 1e-6f);
  EXPECT_NEAR(out_a[0], 1.0f, 1e-6f);
}

}  // namespace
}  // namespace cuflash
