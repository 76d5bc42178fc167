// What backend=cuda refuses, and how: valid calls it cannot run answer
// `unsupported` with the reason (head dims outside the tensor-core kernels'
// list; KV caches in f32, backward, with dropout, page sizes that are not powers
// of two, appends from unaligned rows), the workspace query agrees with the call, and nothing is
// written: every tensor, outputs (NaN poison) and the KV cache included, comes
// back byte-identical. Views the kernels may or may not take (rows not
// 16-byte aligned) must be either refused so or computed right, never silently
// wrong. Also the RunContext variants: no workspace, too small a workspace,
// the default stream.
#include <gtest/gtest.h>

#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "common/kv_cache_cases.hpp"
#include "device_runner.hpp"
#include "gpu_cases.hpp"

namespace cuflash::test {
namespace {

using Pass = TestPass;

// ----- head dims ------------------------------------------------------------------
// Every head dim up to 256 runs (forward_matrix.cpp, backward_matrix.cpp,
// decode_gpu_test.cpp test them against the oracle).

// Above 256 nothing in backend cuda runs, f32 included.
TEST(CudaUnsupported, HeadDimAbove256) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    SCOPED_TRACE(dtype_label(dtype));
    CaseSpec s = dense_case("d288", 9, 12, 2, 1, 288);
    s.dtype = dtype;
    AttentionCase c(s, rng.engine());
    DeviceRunner runner;
    expect_refused(c, runner, Pass::forward, {"288"});
    expect_refused(c, runner, Pass::backward, {"288"});
  }
}

// ----- KV caches: what the decode kernel does not take ----------------------------------
// (What it takes is tested against the oracle in decode_gpu_test.cpp.)

CaseSpec cache_case(std::string label, int page_size, int q_len, int new_len, DType dtype) {
  CaseSpec s = kv_cache_case(std::move(label), page_size, q_len, new_len);
  s.dtype = dtype;
  return s;
}

// f32 caches have no kernel in backend cuda (the f32 path is dense/varlen only).
TEST(CudaUnsupportedKvCache, F32ForwardRefusedAndCacheUntouched) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (const CaseSpec& s : {cache_case("contiguous_decode", 0, 1, 0, DType::f32),
                            cache_case("contiguous_append", 0, 4, 4, DType::f32),
                            cache_case("paged16_decode_append1", 16, 1, 1, DType::f32)}) {
    SCOPED_TRACE(s.label);
    AttentionCase c(s, rng.engine());
    DeviceRunner runner;
    // (An append would have written k_new/v_new into the cache: it must not have.)
    expect_refused(c, runner, Pass::forward, {"backend cuda", "kv cache", "f16 and bf16", "f32"});
  }
}

class CudaUnsupportedKvCache : public ::testing::TestWithParam<DtypeParam> {};

TEST_P(CudaUnsupportedKvCache, BackwardRefused) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (const CaseSpec& s :
       {cache_case("contiguous", 0, 5, 0, GetParam().dtype), cache_case("paged16", 16, 5, 0, GetParam().dtype)}) {
    SCOPED_TRACE(s.label);
    AttentionCase c(s, rng.engine());
    DeviceRunner runner;
    expect_refused(c, runner, Pass::backward, {"kv"});
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaUnsupportedKvCache, all_dtype_params(), dtype_param_name);

// Page and slot are a shift and a mask: other page sizes are refused, naming it.
TEST(CudaUnsupportedKvCache, PageSizeNotAPowerOfTwo) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(cache_case("paged24_append2", 24, 2, 2, DType::bf16), rng.engine());
  DeviceRunner runner;
  expect_refused(c, runner, Pass::forward, {"backend cuda", "page_size 24", "power of two"});
}

// A head dim above 256, for a cache as for dense inputs.
TEST(CudaUnsupportedKvCache, HeadDimAbove256) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = cache_case("paged16_d264", 16, 3, 2, DType::f16);
  s.head_dim = 264;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner;
  expect_refused(c, runner, Pass::forward, {"head_dim 264", "multiples of 8 up to 256"});
}

// k_new off its 16-byte boundary: the append's vector copies cannot take it.
TEST(CudaUnsupportedKvCache, AppendSourceOff16Bytes) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(cache_case("paged16_append3", 16, 1, 3, DType::bf16), rng.engine());
  DeviceRunner runner;
  runner.misalign_bytes = 4;
  runner.misalign_only = "k_new";
  expect_refused(c, runner, Pass::forward, {"backend cuda", "kv_cache.k_new", "16-byte"});
}

// auto with an f32 cache: neither GPU backend runs it, and it says why for both.
TEST(CudaUnsupportedKvCache, AutoRefusesF32WithCudasReason) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  AttentionCase c(cache_case("paged16", 16, 1, 1, DType::f32), rng.engine());
  DeviceRunner runner(Backend::automatic);
  expect_refused(c, runner, Pass::forward, {"backend auto: no GPU backend runs this call", "backend cuda", "f32"},
                 Backend::automatic);
}

// ----- views off 16-byte rows: refused with a reason, or right ----------------------------

struct AlignmentCase {
  std::string label;
  DType dtype;
  Pass pass;
  int row_padding;        // elements after every row (not a multiple of 8: rows off 16 bytes)
  std::size_t misalign;   // bytes added to a tensor's address (4: off 16 bytes, on 4)
  std::string only = "";  // that tensor only; "": every tensor
  bool bhsd = false;
};

void PrintTo(const AlignmentCase& a, std::ostream* os) { *os << a.label; }

class CudaAlignment : public ::testing::TestWithParam<AlignmentCase> {};

TEST_P(CudaAlignment, RefusedWithReasonOrCorrect) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const AlignmentCase& a = GetParam();
  CaseSpec s = causal(dense_case(a.label, 65, 100, 4, 2, 64));
  s.dtype = a.dtype;
  s.row_padding = a.row_padding;
  s.bhsd = a.bhsd;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner;
  runner.misalign_bytes = a.misalign;
  runner.misalign_only = a.only;
  const AttentionCase before = c;
  const Status status = run_pass(runner, c, a.pass);
  if (status.code() == StatusCode::unsupported) {
    EXPECT_NE(status.message().find("backend cuda"), std::string::npos) << status.message();
    expect_case_unchanged(before, c);
    std::printf("[ note ] %s: refused: %s\n", a.label.c_str(), status.message().c_str());
    return;
  }
  ASSERT_TRUE(status.ok()) << status.to_string();
  std::printf("[ note ] %s: accepted, checked against the oracle\n", a.label.c_str());
  if (a.pass == Pass::forward)
    check_forward_gpu(c, runner);
  else
    check_backward_gpu(c, runner);
}

INSTANTIATE_TEST_SUITE_P(
    Views, CudaAlignment,
    ::testing::Values(AlignmentCase{"bf16_forward_padding_5", DType::bf16, Pass::forward, 5, 0},
                      AlignmentCase{"f16_backward_padding_3", DType::f16, Pass::backward, 3, 0},
                      AlignmentCase{"bf16_forward_bhsd_padding_4", DType::bf16, Pass::forward, 4, 0, "", true},
                      AlignmentCase{"f16_forward_address_plus_4", DType::f16, Pass::forward, 0, 4},
                      AlignmentCase{"bf16_backward_address_plus_4", DType::bf16, Pass::backward, 0, 4},
                      // One tensor off while q, k, v are aligned: each output and backward input.
                      AlignmentCase{"bf16_forward_out_address_plus_4", DType::bf16, Pass::forward, 0, 4, "out"},
                      AlignmentCase{"f16_forward_v_address_plus_4", DType::f16, Pass::forward, 0, 4, "v"},
                      AlignmentCase{"bf16_backward_dout_address_plus_4", DType::bf16, Pass::backward, 0, 4, "dout"},
                      AlignmentCase{"f16_backward_out_address_plus_4", DType::f16, Pass::backward, 0, 4, "out"},
                      AlignmentCase{"bf16_backward_dq_address_plus_4", DType::bf16, Pass::backward, 0, 4, "dq"},
                      AlignmentCase{"f16_backward_dk_address_plus_4", DType::f16, Pass::backward, 0, 4, "dk"},
                      AlignmentCase{"bf16_backward_dv_address_plus_4", DType::bf16, Pass::backward, 0, 4, "dv"},
                      AlignmentCase{"f32_forward_padding_5_address_plus_4", DType::f32, Pass::forward, 5, 4},
                      AlignmentCase{"f32_backward_padding_3_address_plus_4", DType::f32, Pass::backward, 3, 4}),
    [](const ::testing::TestParamInfo<AlignmentCase>& info) { return info.param.label; });

// ----- RunContext: workspace and stream ---------------------------------------------------

// No workspace given: the backend finds its own scratch (split-KV forward, backward dq accumulator).
TEST(CudaWorkspace, NoneGivenStillRuns) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_label(dtype));
    CaseSpec s = dense_case("splitkv", 1, 4097, 2, 1, 128, 1);
    s.dtype = dtype;
    AttentionCase fwd(s, rng.engine());
    DeviceRunner runner;
    runner.workspace_mode = WorkspaceMode::none;
    check_forward_gpu(fwd, runner);
    CaseSpec b = causal(dense_case("bwd", 65, 300, 4, 2, 64));
    b.dtype = dtype;
    AttentionCase bwd(b, rng.engine());
    check_backward_gpu(bwd, runner);
  }
}

// Less than the query said: invalid_argument naming the workspace, nothing written.
TEST(CudaWorkspace, TooSmallIsInvalidArgument) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(dense_case("bwd", 65, 300, 4, 2, 64));
  s.dtype = DType::bf16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner;
  runner.workspace_mode = WorkspaceMode::too_small;
  const AttentionCase before = c;
  const Status status = runner.backward(c, c.options(Backend::cuda));
  ASSERT_TRUE(runner.last_workspace_status.ok()) << runner.last_workspace_status.to_string();
  if (runner.last_workspace_bytes == 0) GTEST_SKIP() << "this backward needs no workspace: nothing to shrink";
  EXPECT_EQ(status.code(), StatusCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("workspace"), std::string::npos) << status.message();
  expect_case_unchanged(before, c);
}

// RunContext::stream = nullptr: the legacy default stream.
TEST(CudaStream, DefaultStream) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = causal(dense_case("default_stream", 65, 130, 4, 2, 64));
  s.dtype = DType::f16;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner;
  runner.default_stream = true;
  check_forward_gpu(c, runner);
  check_backward_gpu(c, runner);
}

// ----- features only backend cpu has so far ----------------------------------------
// Sinks: cudnn refuses them (cuda runs them: sinks_gpu_test.cpp). Dropout:
// cuda runs it for dense and varlen inputs (dropout_gpu_test.cpp) but not with
// a KV cache, and cudnn refuses it (its SDPA dropout is not cuflash's Philox
// mask); each refuses by name, writes nothing, and nothing falls back silently.

TEST(GpuUnsupported, SinksRefusedByNameOnCudnn) {
  SKIP_WITHOUT_CUDNN();  // a build without cuDNN refuses the backend itself
  CUFLASH_TEST_RNG(rng);
  CaseSpec sinks = dense_case("sinks", 33, 40, 4, 2, 64);
  sinks.dtype = DType::bf16;
  sinks.sinks = true;
  AttentionCase with_sinks(sinks, rng.engine());
  DeviceRunner runner(Backend::cudnn);
  expect_refused(with_sinks, runner, Pass::forward, {"sinks"}, Backend::cudnn);
}

TEST(CudnnUnsupported, DropoutRefusedByName) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_label(dtype));
    CaseSpec dropout = causal(dense_case("dropout", 33, 40, 4, 2, 64));
    dropout.dtype = dtype;
    dropout.options.dropout_p = 0.1f;
    AttentionCase with_dropout(dropout, rng.engine());
    DeviceRunner runner(Backend::cudnn);
    expect_refused(with_dropout, runner, Pass::forward, {"dropout_p", "backend cudnn"}, Backend::cudnn);
    expect_refused(with_dropout, runner, Pass::backward, {"dropout_p", "backend cudnn"}, Backend::cudnn);
  }
}

// The KV-cache layout (decode and prefill, contiguous and paged, with and
// without an append) has no dropout in backend cuda: refused naming dropout_p
// and the layout, and the cache, appends included, is left as it was.
TEST(CudaUnsupportedKvCache, DropoutRefusedByName) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::bf16, DType::f16})
    for (CaseSpec s : {cache_case("contiguous_decode", 0, 1, 0, dtype),
                       cache_case("paged16_decode_append1", 16, 1, 1, dtype),
                       cache_case("paged16_prefill5_append3", 16, 5, 3, dtype)}) {
      SCOPED_TRACE(s.label + " " + dtype_label(dtype));
      s.options.dropout_p = 0.1f;
      AttentionCase c(s, rng.engine());
      DeviceRunner runner;
      expect_refused(c, runner, Pass::forward, {"dropout_p", "backend cuda", "kv"});
    }
}

// auto: neither GPU backend runs dropout with a KV cache, and it says so.
TEST(CudaUnsupportedKvCache, AutoRefusesDropoutByName) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  CaseSpec s = cache_case("paged16_append1", 16, 1, 1, DType::bf16);
  s.options.dropout_p = 0.5f;
  AttentionCase c(s, rng.engine());
  DeviceRunner runner(Backend::automatic);
  expect_refused(c, runner, Pass::forward, {"backend auto: no GPU backend runs this call", "dropout_p"},
                 Backend::automatic);
}

}  // namespace
}  // namespace cuflash::test
