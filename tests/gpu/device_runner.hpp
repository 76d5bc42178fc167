// Running the shared attention checks (tests/common/attention_check.hpp) on
// backend=cuda: DeviceRunner copies every host tensor of an AttentionCase to
// its own cudaMalloc'd buffer byte for byte (strides, row padding and NaN
// poison included), calls the API on device views with a real stream, and
// copies every tensor back, so that check_forward/check_backward see what the
// GPU wrote and whether it touched its inputs. Each buffer has guard bytes on
// both sides that must come back unchanged (a write past a tensor fails the
// test even without compute-sanitizer; CUFLASH_TEST_NO_GUARDS=1 turns them
// off, so that under memcheck every tensor is exactly its own allocation).
// Workspaces come from the workspace-size queries and start as 0xFF bytes.
//
// Test names that start with "Sanitize" (also as the instantiation prefix of
// parameterized suites) form the small subset that scripts/gpu-check.sh runs
// under compute-sanitizer.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

#include "common/attention_check.hpp"
#include "cuflash/cuflash.hpp"

// Every GPU test starts with this: without a visible GPU the test is reported
// as skipped (CTest's SKIP_REGULAR_EXPRESSION), never as passed or failed.
#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    if (!::cuflash::backend_available(::cuflash::Backend::cuda))        \
      GTEST_SKIP() << "no CUDA GPU visible (backend cuda unavailable)"; \
  } while (0)

// The same for the cuDNN backend's suites.
#define SKIP_WITHOUT_CUDNN()                                                                            \
  do {                                                                                                  \
    if (!::cuflash::backend_available(::cuflash::Backend::cudnn))                                       \
      GTEST_SKIP() << "backend cudnn unavailable (no CUDA GPU visible, or built without cuDNN)";          \
  } while (0)

namespace cuflash::test {

// How the runner hands scratch memory to the call.
enum class WorkspaceMode {
  queried,    // forward/backward_workspace_size, cudaMalloc'd and filled with 0xFF (NaN) bytes
  none,       // RunContext without a workspace: the backend allocates its own
  too_small,  // one byte less than queried (when the query says > 0): must be invalid_argument
};

class DeviceRunner : public Runner {
 public:
  // `backend` is what check_forward/check_backward put into the options
  // (cuda, or automatic to test the choice).
  explicit DeviceRunner(Backend backend = Backend::cuda);
  ~DeviceRunner() override;
  DeviceRunner(const DeviceRunner&) = delete;
  DeviceRunner& operator=(const DeviceRunner&) = delete;

  Backend backend() const override { return backend_; }
  // The API's Status; a failure of the harness itself (cudaMalloc, copies,
  // stream sync) comes back as cuda_error with "test harness:" in its message.
  // Whatever the status, every tensor is copied back to the host afterwards.
  Status forward(AttentionCase& c, const AttentionOptions& options) override;
  Status backward(AttentionCase& c, const AttentionOptions& options) override;

  WorkspaceMode workspace_mode = WorkspaceMode::queried;
  // Added to the device address of every tensor, or only of the one named
  // misalign_only ("q", "out", "dq", ... as in AttentionCase), e.g. 4: off its
  // 16-byte boundary, on every element size's. 0 keeps cudaMalloc's 256-byte alignment.
  std::size_t misalign_bytes = 0;
  std::string misalign_only;
  // RunContext::stream = nullptr (the legacy default stream) instead of a
  // created non-blocking stream.
  bool default_stream = false;

  // What the last call's workspace query answered (bytes valid when ok).
  Status last_workspace_status;
  std::size_t last_workspace_bytes = 0;

 private:
  template <typename Args, typename Query, typename Call>
  Status run(AttentionCase& c, Args args, Query query, Call call);

  Backend backend_;
  void* stream_ = nullptr;  // cudaStream_t
};

// The max-abs bounds the GPU suites add to check_forward/check_backward's
// default tolerances (which bound f16/bf16 by rel-L2 only): |got - ref| over
// the largest |ref| of the tensor, so that a single wrong row or tile, which a
// rel-L2 over a large tensor can dilute, still fails. Generous: ~10x the
// rounding of an fp16/bf16 P and output (2^-11 / 2^-8).
struct MaxAbsBound {
  double out = 0.0;
  double grad = 0.0;
};
MaxAbsBound gpu_max_abs_bound(DType dtype);
void expect_max_abs(const ForwardErrors& errors, DType dtype, Backend backend);
void expect_max_abs(const BackwardErrors& errors, DType dtype, Backend backend);

// check_forward / check_backward with the default tolerances plus the bounds above.
ForwardErrors check_forward_gpu(AttentionCase& c, Runner& runner);
BackwardErrors check_backward_gpu(AttentionCase& c, Runner& runner);

// ----- checks the backends' suites share -----------------------------------------

enum class TestPass { forward, backward };
const char* test_pass_name(TestPass pass);
Status run_pass(DeviceRunner& runner, AttentionCase& c, TestPass pass, Backend backend = Backend::cuda);

// Every tensor of the case, byte for byte (a failed call writes nothing).
void expect_case_unchanged(const AttentionCase& before, const AttentionCase& after);

// The call answers `unsupported`, its message contains every one of
// `must_mention` (case-insensitive), the workspace query agrees, and no
// tensor changed.
void expect_refused(AttentionCase& c, DeviceRunner& runner, TestPass pass, const std::vector<std::string>& must_mention,
                    Backend backend = Backend::cuda);

// Varlen: packed rows after cu_seqlens_q[B] belong to no sequence, so out
// there keeps the NaN poison.
void expect_unowned_out_rows_untouched(const AttentionCase& c);

// Rows that see no key get out exactly 0 and lse exactly -inf, spelled out
// rather than left to the generic comparison (causal, 9 queries over 4 keys).
void check_masked_rows(DType dtype, Backend backend);

// deterministic = true: two runs on the same inputs, each into fresh
// NaN-poisoned gradients, give the same bits (and the first matches the oracle).
void check_deterministic_backward(CaseSpec spec, Backend backend);
// The backward once more with `options`, into NaN-poisoned gradients: the
// same bytes of dq, dk and dv as c holds from the run before.
void expect_same_gradients_on_rerun(AttentionCase& c, DeviceRunner& runner, const AttentionOptions& options);

}  // namespace cuflash::test
