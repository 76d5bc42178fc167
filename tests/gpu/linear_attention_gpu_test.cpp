// Linear attention on backend cuda against the float64 oracle (and the decode
// step against the chunked forward), on the GPU: fresh random inputs, every
// output poisoned with NaN before the call and copied back whole. The matrix
// covers feature map x normalize x causal x dense/varlen x f32/f16/bf16 with
// GQA and Dk != Dv (f16/bf16 with head dims 64/128 run the chunked tensor-core
// forward and backward: lengths around the 64-row chunk and past the state
// walk's four stages, 0 and 1); other head dims and unaligned rows take the SIMT path of the same
// backend, and so do the tensor-core cases under CUFLASH_LINEAR_KERNEL=simt;
// the causal forward runs the fused kernel, and its causal cases run again on
// the walk and the pass under CUFLASH_LINEAR_FORWARD=walk; backend cudnn
// still refuses by name. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/linear_case.hpp"
#include "common/test_tensors.hpp"
#include "cpu/linear_oracle.hpp"
#include "cuflash/cuflash.hpp"
#include "device_runner.hpp"

namespace cuflash::test {
namespace {

// The GPU matrix's defaults: bf16 on the tensor-core path's dims, [B, H, S, D]
// strides (varlen: the same strides over packed rows).
LinearSpec gpu_spec() {
  LinearSpec s;
  s.dtype = DType::bf16;
  s.key_dim = 64;
  s.value_dim = 128;
  s.layout = MemoryLayout::bhsd();
  return s;
}

// Device copies of host tensors, byte for byte (strides and NaN poison
// included); copied back by fetch(), freed on scope exit.
class DeviceTensors {
 public:
  DeviceTensors() = default;
  DeviceTensors(const DeviceTensors&) = delete;
  DeviceTensors& operator=(const DeviceTensors&) = delete;
  ~DeviceTensors() {
    for (auto& [host, device] : copies_) cudaFree(device);
  }

  TensorView put(HostTensor& host) {
    if (host.empty()) return {};
    void* device = nullptr;
    const std::size_t bytes = std::max<std::size_t>(host.bytes().size(), 16);
    EXPECT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(device, host.bytes().data(), host.bytes().size(), cudaMemcpyHostToDevice), cudaSuccess);
    copies_.push_back({&host, device});
    return host.view_at(device, Device::cuda(0));
  }

  void fetch() {
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (auto& [host, device] : copies_)
      EXPECT_EQ(cudaMemcpy(host->bytes().data(), device, host->bytes().size(), cudaMemcpyDeviceToHost), cudaSuccess);
  }

 private:
  std::vector<std::pair<HostTensor*, void*>> copies_;
};

Status gpu_forward(LinearCase& c, Backend backend = Backend::cuda) {
  DeviceTensors d;
  LinearForwardArgs a;
  a.q = d.put(c.q), a.k = d.put(c.k), a.v = d.put(c.v), a.out = d.put(c.out), a.cu_seqlens = d.put(c.cu_seqlens);
  a.initial_state = d.put(c.initial_state), a.initial_key_sum = d.put(c.initial_key_sum);
  a.final_state = d.put(c.final_state), a.final_key_sum = d.put(c.final_key_sum);
  const Status status = linear_attention_forward(a, c.options(backend));
  d.fetch();
  return status;
}

Status gpu_backward(LinearCase& c, Backend backend = Backend::cuda) {
  DeviceTensors d;
  LinearBackwardArgs a;
  a.q = d.put(c.q), a.k = d.put(c.k), a.v = d.put(c.v), a.dout = d.put(c.dout), a.cu_seqlens = d.put(c.cu_seqlens);
  a.initial_state = d.put(c.initial_state), a.initial_key_sum = d.put(c.initial_key_sum);
  a.dfinal_state = d.put(c.dfinal_state), a.dfinal_key_sum = d.put(c.dfinal_key_sum);
  a.dq = d.put(c.dq), a.dk = d.put(c.dk), a.dv = d.put(c.dv);
  a.dinitial_state = d.put(c.dinitial_state), a.dinitial_key_sum = d.put(c.dinitial_key_sum);
  const Status status = linear_attention_backward(a, c.options(backend));
  d.fetch();
  return status;
}

// rel-L2 against float64. The tensor-core kernels round φ(q) (the backward's
// φ(q)/den), φ(k), the chunk's scores (and their gradients) and the copy of
// the state (and of its gradient) to the input dtype (fp32 accumulation): a
// few roundings of 2^-11 (f16) or 2^-8 (bf16) relative.
double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 2e-5;
    case DType::f16: return 2e-3;
    default: return 1.2e-2;
  }
}

void expect_forward_close(const LinearCase& c, const oracle::LinearForwardResult& ref, bool exact_zeros = true) {
  expect_close(c.out, ref.out, tolerance(c.spec.dtype), "out", 0.0, exact_zeros);
  // The state sums fp32 products of the inputs (φk rounded to the dtype on the tensor-core path).
  const double state_tol = c.spec.dtype == DType::f32 ? 2e-5 : tolerance(c.spec.dtype) / 2;
  if (!c.final_state.empty()) expect_close(c.final_state, ref.final_state, state_tol, "final_state", 0.0, exact_zeros);
  if (!c.final_key_sum.empty())
    expect_close(c.final_key_sum, ref.final_key_sum, state_tol, "final_key_sum", 0.0, exact_zeros);
}

void expect_backward_close(const LinearCase& c, const oracle::LinearBackwardResult& ref, bool exact_zeros = true) {
  const double tol = 2 * tolerance(c.spec.dtype);
  EXPECT_TRUE(all_written(c.dq, "dq"));
  EXPECT_TRUE(all_written(c.dk, "dk"));
  EXPECT_TRUE(all_written(c.dv, "dv"));
  const double scale = std::max({max_abs(ref.dq), max_abs(ref.dk), max_abs(ref.dv)});
  expect_close(c.dq, ref.dq, tol, "dq", scale, exact_zeros);
  expect_close(c.dk, ref.dk, tol, "dk", scale, exact_zeros);
  expect_close(c.dv, ref.dv, tol, "dv", scale, exact_zeros);
  const double state_tol = c.spec.dtype == DType::f32 ? 4e-5 : tol / 2;
  if (!c.dinitial_state.empty())
    expect_close(c.dinitial_state, ref.dinitial_state, state_tol, "dinitial_state", 0.0, exact_zeros);
  if (!c.dinitial_key_sum.empty())
    expect_close(c.dinitial_key_sum, ref.dinitial_key_sum, state_tol, "dinitial_key_sum", 0.0, exact_zeros);
}

void check_forward(LinearCase& c) {
  oracle::LinearForwardResult ref;
  ASSERT_TRUE(oracle::linear_forward_float64(c.forward_args(), c.options(Backend::cpu), &ref).ok());
  const Status status = gpu_forward(c);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_forward_close(c, ref);
}

void check_backward(LinearCase& c) {
  oracle::LinearBackwardResult ref;
  ASSERT_TRUE(oracle::linear_backward_float64(c.backward_args(), c.options(Backend::cpu), &ref).ok());
  const Status status = gpu_backward(c);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_backward_close(c, ref);
}

// Against the CPU reference (backend cpu: fp32 and chunked, linear in the
// length, itself held against the float64 oracle by the CPU tests) where the
// oracle's quadratic sums would take minutes: `twin` has c's inputs.
void check_forward_against_cpu(LinearCase& c, LinearCase& twin) {
  const Status reference = linear_attention_forward(twin.forward_args(), twin.options(Backend::cpu));
  ASSERT_TRUE(reference.ok()) << reference.to_string();
  oracle::LinearForwardResult ref;
  ref.out = twin.out.to_doubles();
  if (!twin.final_state.empty()) ref.final_state = twin.final_state.to_doubles();
  if (!twin.final_key_sum.empty()) ref.final_key_sum = twin.final_key_sum.to_doubles();
  const Status status = gpu_forward(c);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_forward_close(c, ref, /*exact_zeros=*/false);
}

void check_backward_against_cpu(LinearCase& c, LinearCase& twin) {
  const Status reference = linear_attention_backward(twin.backward_args(), twin.options(Backend::cpu));
  ASSERT_TRUE(reference.ok()) << reference.to_string();
  oracle::LinearBackwardResult ref;
  ref.dq = twin.dq.to_doubles();
  ref.dk = twin.dk.to_doubles();
  ref.dv = twin.dv.to_doubles();
  if (!twin.dinitial_state.empty()) ref.dinitial_state = twin.dinitial_state.to_doubles();
  if (!twin.dinitial_key_sum.empty()) ref.dinitial_key_sum = twin.dinitial_key_sum.to_doubles();
  const Status status = gpu_backward(c);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_backward_close(c, ref, /*exact_zeros=*/false);
}

// ---- The matrix ---------------------------------------------------------------------------------


// Dense lengths: around the 64-row chunk, past the state walk's four stages (600 rows: 10
// chunks), and 1.
const std::vector<int> kLengths = {1, 63, 64, 65, 200, 256, 300, 600};

LinearSpec matrix_spec(const LinearMatrixParam& param) {
  const auto& [map, normalize, causal, varlen, dtype] = param;
  LinearSpec s = gpu_spec();
  s.map = map;
  s.normalize = normalize;
  s.causal = causal;
  s.varlen = varlen;
  s.dtype = dtype;
  const int index = matrix_index(param);
  s.with_state = index % 2 == 1;
  // Both (Dk, Dv) orders of the tensor-core path.
  if (index % 3 == 0) std::swap(s.key_dim, s.value_dim);
  if (varlen) {
    s.lengths = {1, 63, 0, 64, 65, 300, 0, 257};
    s.trailing_rows = 3;
    s.layout = MemoryLayout::padded(8);  // rows stay 16-byte aligned
  } else {
    const int length = kLengths[index % kLengths.size()];
    s.lengths = {length, length};
    if (length == 1 && normalize) s.with_state = true;
  }
  return s;
}

std::string matrix_name(const ::testing::TestParamInfo<LinearMatrixParam>& info) {
  const auto& [map, normalize, causal, varlen, dtype] = info.param;
  const LinearSpec s = matrix_spec(info.param);
  std::string name = map_label(map) + (normalize ? "_norm" : "") + (causal ? "_causal" : "_full") +
                     (varlen ? "_varlen" : "_dense" + std::to_string(s.lengths[0])) + "_" + dtype_name(dtype) + "_dk" +
                     std::to_string(s.key_dim);
  return name + (s.with_state ? "_state" : "");
}

class LinearGpuMatrix : public ::testing::TestWithParam<LinearMatrixParam> {};

TEST_P(LinearGpuMatrix, ForwardMatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  LinearCase c(matrix_spec(GetParam()), rng.engine());
  check_forward(c);
}

TEST_P(LinearGpuMatrix, BackwardMatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  LinearCase c(matrix_spec(GetParam()), rng.engine());
  check_backward(c);
}

INSTANTIATE_TEST_SUITE_P(Cuda, LinearGpuMatrix,
                         ::testing::Combine(::testing::Values(FeatureMap::identity, FeatureMap::elu_plus_one,
                                                              FeatureMap::relu),
                                            ::testing::Bool(), ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16)),
                         matrix_name);

// ---- The SIMT recurrence where the tensor cores run ---------------------------------------------

// An environment variable for one scope: CUFLASH_LINEAR_KERNEL=simt keeps
// every linear-attention call on the SIMT recurrence, and
// CUFLASH_LINEAR_FORWARD=walk the causal forward on the walk and the output
// pass instead of the fused kernel: the other paths of the same backend.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name_)) previous_ = old;
    setenv(name_, value, 1);
  }
  ~ScopedEnv() {
    if (previous_) setenv(name_, previous_->c_str(), 1);
    else unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// f16/bf16 cases of the matrix (head dims 64/128, aligned rows) on the SIMT
// path: it stays selectable and right, so that a tensor-core failure of the
// matrix can be told from one of the test or the oracle.
class LinearGpuSimtPath : public ::testing::TestWithParam<LinearMatrixParam> {};

TEST_P(LinearGpuSimtPath, ForwardAndBackwardMatchOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const ScopedEnv simt("CUFLASH_LINEAR_KERNEL", "simt");
  LinearCase forward(matrix_spec(GetParam()), rng.engine());
  check_forward(forward);
  LinearCase backward(matrix_spec(GetParam()), rng.engine());
  check_backward(backward);
}

INSTANTIATE_TEST_SUITE_P(Cuda, LinearGpuSimtPath,
                         ::testing::Combine(::testing::Values(FeatureMap::elu_plus_one), ::testing::Bool(),
                                            ::testing::Bool(), ::testing::Bool(),
                                            ::testing::Values(DType::f16, DType::bf16)),
                         matrix_name);

// The causal cases of the matrix (f16/bf16, head dims 64/128) with the
// forward on the walk of the states and the output pass, the path the
// non-causal forward takes: held against the oracle like the fused kernel
// that the causal forward runs by default.
class LinearGpuWalkForward : public ::testing::TestWithParam<LinearMatrixParam> {};

TEST_P(LinearGpuWalkForward, ForwardMatchesOracle) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const ScopedEnv walk("CUFLASH_LINEAR_FORWARD", "walk");
  LinearCase c(matrix_spec(GetParam()), rng.engine());
  check_forward(c);
}

INSTANTIATE_TEST_SUITE_P(Cuda, LinearGpuWalkForward,
                         ::testing::Combine(::testing::Values(FeatureMap::identity, FeatureMap::elu_plus_one,
                                                              FeatureMap::relu),
                                            ::testing::Bool(), ::testing::Values(true), ::testing::Bool(),
                                            ::testing::Values(DType::f16, DType::bf16)),
                         matrix_name);

// ---- Shapes beyond the matrix -------------------------------------------------------------------

// MHA and MQA at 128/128 (tensor cores), head dims the tensor cores do not take
// and rows that are not 16-byte aligned (the SIMT path of the same backend).
TEST(LinearGpuShapes, HeadsDimsAndAlignment) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  struct Shape {
    int heads_q, heads_kv, key_dim, value_dim;
    MemoryLayout layout;
  };
  for (DType dtype : {DType::bf16, DType::f16})
    for (const Shape& shape : {Shape{3, 3, 128, 128, MemoryLayout::bhsd()}, Shape{6, 1, 128, 64, MemoryLayout{}},
                               Shape{2, 1, 32, 48, MemoryLayout{}}, Shape{2, 2, 64, 64, MemoryLayout::padded(3)}})
      for (bool causal : {true, false}) {
        LinearSpec s = gpu_spec();
        s.dtype = dtype;
        s.heads_q = shape.heads_q;
        s.heads_kv = shape.heads_kv;
        s.key_dim = shape.key_dim;
        s.value_dim = shape.value_dim;
        s.layout = shape.layout;
        s.causal = causal;
        s.map = FeatureMap::elu_plus_one;
        s.normalize = true;
        s.with_state = true;
        s.lengths = {330, 330};
        s.scale = 0.3f;
        SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(shape.heads_q) + "/" +
                     std::to_string(shape.heads_kv) + " heads, Dk " + std::to_string(shape.key_dim) + ", Dv " +
                     std::to_string(shape.value_dim) + (causal ? " causal" : ""));
        LinearCase forward(s, rng.engine());
        check_forward(forward);
        LinearCase backward(s, rng.engine());
        check_backward(backward);
      }
}

// The split chains (linear_walk_segments.hpp). The walk (walk_segments: a
// grid of fewer than 256 CTAs walks each sequence in 3 to 8 segments of at
// least 32 chunks, two launches): with Dk 64, Dv 128 and 2 kv heads the
// grid is 4 CTAs per sequence, so 8229 rows (129 chunks, the last partial)
// walk in 4 segments, 16384 in 8, and the varlen batch (longest 6200: 97
// chunks) in 3 of 32, 32 and 33 chunks, where its 70-row sequence has an
// empty segment and segments of one chunk, and its empty sequence three
// empty ones. The fused causal forward (fused_forward_segments: 2 CTAs per
// sequence, segments of at least 16 chunks) splits them in 8, 8 and 6; it
// runs again under CUFLASH_LINEAR_FORWARD=walk for the walk's split.
// Causal and not (the non-causal total is the sums alone), forward and
// backward (the gradient walk runs its segments in reverse), with states;
// against the CPU reference (the oracle is quadratic in the length).
struct SplitWalkCase {
  std::string name;
  std::vector<int> lengths;
  bool varlen;
  FeatureMap map;
  bool normalize;
};

class LinearGpuSplitWalk : public ::testing::TestWithParam<SplitWalkCase> {};

TEST_P(LinearGpuSplitWalk, MatchesCpuReference) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const SplitWalkCase& shape = GetParam();
  for (bool causal : {true, false}) {
    LinearSpec s = gpu_spec();
    s.lengths = shape.lengths;
    s.varlen = shape.varlen;
    if (shape.varlen) s.layout = MemoryLayout::padded(8);
    s.map = shape.map;
    s.normalize = shape.normalize;
    s.causal = causal;
    s.with_state = true;
    SCOPED_TRACE(causal ? "causal" : "full");
    for (const char* forward_path : {"fused", "walk"}) {
      if (!causal && std::string(forward_path) == "walk") continue;  // non-causal runs the walk anyway
      SCOPED_TRACE(std::string("forward ") + forward_path);
      const ScopedEnv path("CUFLASH_LINEAR_FORWARD", forward_path);
      std::mt19937 twin_engine = rng.engine();
      LinearCase forward(s, rng.engine()), forward_twin(s, twin_engine);
      check_forward_against_cpu(forward, forward_twin);
    }
    std::mt19937 twin_engine = rng.engine();
    LinearCase backward(s, rng.engine()), backward_twin(s, twin_engine);
    check_backward_against_cpu(backward, backward_twin);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, LinearGpuSplitWalk,
                         ::testing::Values(SplitWalkCase{"dense8229", {8229}, false, FeatureMap::identity, false},
                                           SplitWalkCase{"varlen6200", {6200, 0, 70, 2500}, true,
                                                         FeatureMap::elu_plus_one, true},
                                           SplitWalkCase{"dense16384", {16384}, false, FeatureMap::relu, false}),
                         [](const ::testing::TestParamInfo<SplitWalkCase>& info) { return info.param.name; });

// relu with normalize where some queries have no positive entry: φq = 0, the
// normalizer is eps (1e-10) and dout / den is 1e10 dout, past f16's range.
// Such a row's output is 0 and it adds nothing to dk, dv or the state's
// gradient; the tensor-core backward keeps 1/den out of its 16-bit operands
// (the query rows that meet dout carry it), so f16 gives those zeros too
// instead of 0 x inf.
TEST(LinearGpuShapes, ReluQueriesWithNoPositiveEntry) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    LinearSpec s = gpu_spec();
    s.dtype = dtype;
    s.map = FeatureMap::relu;
    s.normalize = true;
    s.with_state = true;
    s.lengths = {200, 200};
    auto with_zero_features = [&](LinearCase& c) {
      // Rows around the chunk boundaries, of every sequence and query head.
      const auto& shape = c.q.shape();  // [B, S, Hq, Dk]
      for (std::int64_t b = 0; b < shape[0]; ++b)
        for (std::int64_t t : {0, 7, 63, 64, 130, 199})
          for (std::int64_t h = 0; h < shape[2]; ++h)
            for (std::int64_t d = 0; d < shape[3]; ++d) {
              const std::int64_t index = ((b * shape[1] + t) * shape[2] + h) * shape[3] + d;
              c.q.set(index, -std::abs(c.q.get(index)));
            }
    };
    LinearCase forward(s, rng.engine());
    with_zero_features(forward);
    check_forward(forward);
    LinearCase backward(s, rng.engine());
    with_zero_features(backward);
    check_backward(backward);
  }
}

// Length 0 passes the initial state on; no batch and no heads write nothing.
TEST(LinearGpuShapes, EmptyExtents) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool normalize : {false, true}) {
      LinearSpec s = gpu_spec();
      s.dtype = dtype;
      s.normalize = normalize;
      s.with_state = true;
      s.lengths = {0, 0};
      LinearCase c(s, rng.engine());
      check_forward(c);
      EXPECT_EQ(c.final_state.to_doubles(), c.initial_state.to_doubles());
      check_backward(c);
      EXPECT_EQ(c.dinitial_state.to_doubles(), c.dfinal_state.to_doubles());
      if (normalize) {
        EXPECT_EQ(c.dinitial_key_sum.to_doubles(), c.dfinal_key_sum.to_doubles());
      }
    }
  LinearSpec no_batch = gpu_spec();
  no_batch.lengths = {};
  LinearCase c(no_batch, rng.engine());
  check_forward(c);
  check_backward(c);
  LinearSpec no_heads = gpu_spec();
  no_heads.heads_q = no_heads.heads_kv = 0;
  no_heads.with_state = true;
  LinearCase h(no_heads, rng.engine());
  check_forward(h);
  check_backward(h);
  LinearSpec no_sequences = gpu_spec();
  no_sequences.varlen = true;
  no_sequences.lengths = {};
  no_sequences.trailing_rows = 2;
  no_sequences.layout = MemoryLayout::padded(8);
  LinearCase v(no_sequences, rng.engine());
  check_forward(v);
  check_backward(v);
}

// ---- The decode step against the chunked forward ------------------------------------------------

HostTensor slice_rows(const HostTensor& t, std::int64_t first, std::int64_t count) {
  const auto& shape = t.shape();
  HostTensor out(t.dtype(), {shape[0], count, shape[2], shape[3]});
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t r = 0; r < count; ++r)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d)
          out.set(((b * count + r) * shape[2] + h) * shape[3] + d,
                  t.get(((b * shape[1] + first + r) * shape[2] + h) * shape[3] + d));
  return out;
}

// The state after a forward over rows [0, split) (on the GPU), then one step per
// row (in place and into a second state, alternately): each step's output is the
// full forward's row, the last state its final state.
class LinearGpuStep : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(LinearGpuStep, StepsEqualTheChunkedForward) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  const auto [dtype, normalize] = GetParam();
  LinearSpec s = gpu_spec();
  s.dtype = dtype;
  s.normalize = normalize;
  s.map = FeatureMap::elu_plus_one;
  s.with_state = true;
  s.lengths = {140, 140};
  s.layout = MemoryLayout{};
  LinearCase full(s, rng.engine());
  ASSERT_TRUE(gpu_forward(full).ok());
  constexpr std::int64_t kSplit = 130;

  LinearSpec prefix_spec = s;
  prefix_spec.lengths = {static_cast<int>(kSplit), static_cast<int>(kSplit)};
  LinearCase prefix(prefix_spec, rng.engine());
  prefix.q = slice_rows(full.q, 0, kSplit), prefix.k = slice_rows(full.k, 0, kSplit);
  prefix.v = slice_rows(full.v, 0, kSplit);
  prefix.initial_state = full.initial_state, prefix.initial_key_sum = full.initial_key_sum;
  ASSERT_TRUE(gpu_forward(prefix).ok());

  DeviceTensors d;
  HostTensor state = prefix.final_state, key_sum = prefix.final_key_sum;
  HostTensor other_state = state, other_key_sum = key_sum;
  const TensorView state_view = d.put(state), other_view = d.put(other_state);
  const TensorView key_sum_view = d.put(key_sum), other_key_sum_view = d.put(other_key_sum);
  bool in_first = true;
  // The step's own rounding of out is that of one output row: the chunked form's tolerance.
  const double tol = tolerance(dtype);
  for (std::int64_t t = kSplit; t < full.rows; ++t) {
    HostTensor q = slice_rows(full.q, t, 1), k = slice_rows(full.k, t, 1), v = slice_rows(full.v, t, 1);
    HostTensor out(dtype, {full.batch, 1, s.heads_q, s.value_dim});
    out.poison();
    DeviceTensors row;
    LinearStepArgs step;
    step.q = row.put(q), step.k = row.put(k), step.v = row.put(v), step.out = row.put(out);
    step.state = in_first ? state_view : other_view;
    if (normalize) step.key_sum = in_first ? key_sum_view : other_key_sum_view;
    const bool in_place = t % 2 == 0;
    if (!in_place) {
      step.state_out = in_first ? other_view : state_view;
      if (normalize) step.key_sum_out = in_first ? other_key_sum_view : key_sum_view;
      in_first = !in_first;
    }
    const Status status = linear_attention_step(step, full.options(Backend::cuda));
    ASSERT_TRUE(status.ok()) << status.to_string();
    row.fetch();
    // (The chunked forward's result, a computation of its own, not the oracle: none of its zeros is structural.)
    const std::vector<double> full_row = slice_rows(full.out, t, 1).to_doubles();
    const ErrorStats st = compare_zeros_where(out, full_row, std::vector<bool>(full_row.size(), false));
    ASSERT_LE(st.rel_l2, tol) << "token " << t << ": " << st.describe();
  }
  d.fetch();
  // The steps add fp32 φ(k) v products, the tensor-core forward φ(k) rounded to the dtype.
  const double state_tol = dtype == DType::f32 ? 1e-5 : tol / 2;
  const HostTensor& last_state = in_first ? state : other_state;
  expect_close(last_state, full.final_state.to_doubles(), state_tol, "state after the steps", 0.0, false);
  if (normalize) {
    const HostTensor& last_key_sum = in_first ? key_sum : other_key_sum;
    expect_close(last_key_sum, full.final_key_sum.to_doubles(), state_tol, "key sum after the steps", 0.0, false);
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, LinearGpuStep,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f16, DType::bf16), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<DType, bool>>& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_norm" : "");
                         });

// ---- The backends without kernels ---------------------------------------------------------------

TEST(LinearGpuRefusal, CudnnRefusesByNameWithNothingWritten) {
  SKIP_WITHOUT_CUDNN();
  CUFLASH_TEST_RNG(rng);
  LinearSpec s = gpu_spec();
  s.with_state = true;
  LinearCase c(s, rng.engine());
  const Status forward = gpu_forward(c, Backend::cudnn);
  const Status backward = gpu_backward(c, Backend::cudnn);
  for (const Status& status : {forward, backward}) {
    EXPECT_EQ(status.code(), StatusCode::unsupported) << status.to_string();
    EXPECT_NE(status.message().find("linear attention"), std::string::npos) << status.message();
  }
  for (const HostTensor* t : {&c.out, &c.final_state, &c.dq, &c.dk, &c.dv, &c.dinitial_state})
    EXPECT_EQ(t->count_nan(), t->numel());
}

// auto on GPU memory picks backend cuda.
TEST(LinearGpuRefusal, AutoRunsOnCuda) {
  SKIP_WITHOUT_GPU();
  CUFLASH_TEST_RNG(rng);
  LinearSpec s = gpu_spec();
  LinearCase c(s, rng.engine());
  ASSERT_TRUE(gpu_forward(c, Backend::automatic).ok());
  EXPECT_TRUE(all_written(c.out, "out"));
}

}  // namespace
}  // namespace cuflash::test
