// Ring attention over NCCL (include/cuflash/ring.hpp) on every GPU of this
// machine: one process, one thread per rank, communicators from
// ncclCommInitAll. Forward (out, lse) and backward (dq, dk, dv) of the shards
// must equal attention over the whole sequence (backend cpu, f32, on the
// same rounded inputs) restricted to each rank's rows: dense and varlen,
// zigzag and contiguous, causal and not, GQA, window + ALiBi, bf16 and f32.
// World sizes 1, 2 and 4 as GPUs allow; the rest skip with the reason.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"
#include "cuflash/ring.hpp"

namespace cuflash::test {
namespace {

constexpr int kHeadsQ = 4, kHeadsKv = 2, kDim = 64;

struct RingCase {
  std::string name;
  int world;
  RingLayout layout;
  bool varlen, causal, window_alibi;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<RingCase>& info) { return info.param.name; }

int visible_gpus() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

HostTensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::mt19937& engine) {
  HostTensor t(dtype, std::move(shape));
  std::normal_distribution<double> normal;
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(engine));
  return t;
}

HostTensor as_f32(const HostTensor& t) {
  HostTensor f(DType::f32, t.shape());
  for (std::int64_t i = 0; i < t.numel(); ++i) f.set(i, t.get(i));
  return f;
}

// The whole sequence's rows that a rank holds, in its local order: for each
// sequence (batch entry, or packed varlen sequence), its chunks in local order.
struct Layout {
  std::vector<int> seq_lens;     // global lengths (dense: every batch entry)
  std::vector<std::int64_t> rows;  // local row -> global row (varlen: packed; dense: within a sequence)
  std::vector<std::int32_t> cu;  // varlen: local cu_seqlens
  int max_local = 0;
};

Layout layout_of(const RingCase& c, const std::vector<int>& seq_lens, int rank) {
  Layout l;
  l.seq_lens = seq_lens;
  const int chunks = ring_chunks_per_rank(c.layout);
  std::int64_t global_start = 0;
  l.cu.push_back(0);
  for (std::size_t s = 0; s < seq_lens.size(); ++s) {
    const int chunk = seq_lens[s] / (c.world * chunks);
    for (int local = 0; local < chunks; ++local) {
      const int g = ring_global_chunk(c.layout, c.world, rank, local);
      for (int i = 0; i < chunk; ++i) l.rows.push_back((c.varlen ? global_start : 0) + g * chunk + i);
    }
    l.cu.push_back(static_cast<std::int32_t>(l.rows.size()));
    l.max_local = std::max(l.max_local, chunk * chunks);
    global_start += seq_lens[s];
    if (!c.varlen) break;  // dense: one sequence's rows serve every batch entry
  }
  return l;
}

// Gather rows: dense [B, S, H, D] along dim 1, varlen [T, H, D] along dim 0.
HostTensor gather(const HostTensor& whole, const Layout& l, bool varlen) {
  auto shape = whole.shape();
  const int row_dim = varlen ? 0 : 1;
  const std::int64_t whole_rows = shape[row_dim];
  shape[row_dim] = static_cast<std::int64_t>(l.rows.size());
  HostTensor local(whole.dtype(), shape);
  const std::int64_t batches = varlen ? 1 : shape[0];
  const std::int64_t row_elems = shape[row_dim + 1] * shape[row_dim + 2];
  for (std::int64_t b = 0; b < batches; ++b)
    for (std::size_t r = 0; r < l.rows.size(); ++r)
      for (std::int64_t e = 0; e < row_elems; ++e)
        local.set((b * static_cast<std::int64_t>(l.rows.size()) + r) * row_elems + e,
                  whole.get((b * whole_rows + l.rows[r]) * row_elems + e));
  return local;
}

// Gather lse: dense [B, H, S] along dim 2, varlen [H, T] along dim 1.
HostTensor gather_lse(const HostTensor& whole, const Layout& l, bool varlen) {
  auto shape = whole.shape();
  const int row_dim = varlen ? 1 : 2;
  const std::int64_t whole_rows = shape[row_dim];
  shape[row_dim] = static_cast<std::int64_t>(l.rows.size());
  HostTensor local(DType::f32, shape);
  const std::int64_t outer = whole.numel() / whole_rows;
  for (std::int64_t o = 0; o < outer; ++o)
    for (std::size_t r = 0; r < l.rows.size(); ++r)
      local.set(o * static_cast<std::int64_t>(l.rows.size()) + r, whole.get(o * whole_rows + l.rows[r]));
  return local;
}

struct DeviceBuffer {
  void* data = nullptr;
  HostTensor host;
  DeviceBuffer(const HostTensor& h, bool poison) : host(h) {
    cudaMalloc(&data, std::max<std::size_t>(host.bytes().size(), 1));
    if (poison) cudaMemset(data, 0xFF, host.bytes().size());  // NaN in every float dtype
    else cudaMemcpy(data, host.bytes().data(), host.bytes().size(), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(data); }
  TensorView view(int device) const { return host.view_at(data, Device::cuda(device)); }
  HostTensor back() {
    cudaMemcpy(host.bytes().data(), data, host.bytes().size(), cudaMemcpyDeviceToHost);
    return host;
  }
};

double max_rel_error(const HostTensor& got, const HostTensor& want) {
  double err = 0.0, scale = 1.0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.get(i), g = got.get(i);
    if (std::isinf(w) && g == w) continue;
    if (!std::isfinite(g)) return std::numeric_limits<double>::infinity();
    err = std::max(err, std::abs(g - w));
    scale = std::max(scale, std::abs(w));
  }
  return err / scale;
}

class RingGpu : public ::testing::TestWithParam<RingCase> {};

TEST_P(RingGpu, ShardsEqualWholeSequenceAttention) {
  const RingCase c = GetParam();
  if (!backend_available(Backend::cuda)) GTEST_SKIP() << "no CUDA GPU visible (backend cuda unavailable)";
  if (!ring_attention_available()) GTEST_SKIP() << "this build has no NCCL ring attention";
  if (visible_gpus() < c.world)
    GTEST_SKIP() << "needs " << c.world << " GPUs, " << visible_gpus() << " visible";
  CUFLASH_TEST_RNG(rng);
  const int chunks = ring_chunks_per_rank(c.layout);
  const int unit = c.world * chunks;
  const std::vector<int> seq_lens = c.varlen ? std::vector<int>{unit * 24, unit * 40, unit * 8}
                                             : std::vector<int>{unit * 48};
  const int batch = c.varlen ? 1 : 2;
  std::int64_t total = 0;
  for (int len : seq_lens) total += len;
  const std::vector<std::int64_t> q_shape =
      c.varlen ? std::vector<std::int64_t>{total, kHeadsQ, kDim} : std::vector<std::int64_t>{batch, total, kHeadsQ, kDim};
  std::vector<std::int64_t> kv_shape = q_shape;
  kv_shape[kv_shape.size() - 2] = kHeadsKv;
  const HostTensor q = random_tensor(c.dtype, q_shape, rng.engine());
  const HostTensor k = random_tensor(c.dtype, kv_shape, rng.engine());
  const HostTensor v = random_tensor(c.dtype, kv_shape, rng.engine());
  const HostTensor dout = random_tensor(c.dtype, q_shape, rng.engine());
  HostTensor slopes(DType::f32, {kHeadsQ});
  for (int h = 0; h < kHeadsQ; ++h) slopes.set(h, 0.02 * (h + 1));

  AttentionOptions options;
  options.causal = c.causal;
  if (c.window_alibi) options.window_left = 37, options.window_right = c.causal ? -1 : 11;

  // The whole sequence on the CPU, in f32 from the same rounded values.
  const HostTensor qf = as_f32(q), kf = as_f32(k), vf = as_f32(v), doutf = as_f32(dout);
  std::vector<std::int32_t> cu_whole = {0};
  for (int len : seq_lens) cu_whole.push_back(cu_whole.back() + len);
  const HostTensor cu_whole_t = HostTensor::from_i32(cu_whole, {static_cast<std::int64_t>(cu_whole.size())});
  const int max_whole = *std::max_element(seq_lens.begin(), seq_lens.end());
  const std::vector<std::int64_t> lse_shape = c.varlen ? std::vector<std::int64_t>{kHeadsQ, total}
                                                       : std::vector<std::int64_t>{batch, kHeadsQ, total};
  HostTensor out_ref(DType::f32, q_shape), lse_ref(DType::f32, lse_shape);
  HostTensor dq_ref(DType::f32, q_shape), dk_ref(DType::f32, kv_shape), dv_ref(DType::f32, kv_shape);
  AttentionOptions cpu = options;
  cpu.backend = Backend::cpu;
  ForwardArgs f{qf.view(), kf.view(), vf.view(), out_ref.view(), lse_ref.view()};
  if (c.window_alibi) f.alibi_slopes = slopes.view();
  if (c.varlen) f.varlen = {cu_whole_t.view(), cu_whole_t.view(), max_whole, max_whole};
  ASSERT_TRUE(attention_forward(f, cpu).ok());
  BackwardArgs g{qf.view(), kf.view(), vf.view(), out_ref.view(), doutf.view(), lse_ref.view(),
                 dq_ref.view(), dk_ref.view(), dv_ref.view()};
  g.alibi_slopes = f.alibi_slopes;
  g.varlen = f.varlen;
  ASSERT_TRUE(attention_backward(g, cpu).ok());

  std::vector<ncclComm_t> comms(c.world);
  std::vector<int> devices(c.world);
  for (int r = 0; r < c.world; ++r) devices[r] = r;
  ASSERT_EQ(ncclCommInitAll(comms.data(), c.world, devices.data()), ncclSuccess);

  // Each rank: its shards on its GPU; the ring forward, then the ring
  // backward from the ring forward's out and lse (as autograd would).
  std::vector<std::string> failures(c.world);
  std::vector<HostTensor> outs(c.world), lses(c.world), dqs(c.world), dks(c.world), dvs(c.world);
  std::vector<Layout> layouts(c.world);
  auto run_rank = [&](int r) {
    cudaSetDevice(r);
    layouts[r] = layout_of(c, seq_lens, r);
    const Layout& l = layouts[r];
    DeviceBuffer q_in(gather(q, l, c.varlen), false), k_in(gather(k, l, c.varlen), false),
        v_in(gather(v, l, c.varlen), false), dout_in(gather(dout, l, c.varlen), false);
    DeviceBuffer out_buf(gather(q, l, c.varlen), true), lse_buf(gather_lse(lse_ref, l, c.varlen), true);
    DeviceBuffer gq(gather(q, l, c.varlen), true), gk(gather(k, l, c.varlen), true), gv(gather(v, l, c.varlen), true);
    DeviceBuffer alibi(slopes, false);
    const HostTensor cu_local = HostTensor::from_i32(l.cu, {static_cast<std::int64_t>(l.cu.size())});
    DeviceBuffer cu(cu_local, false);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    RingForwardArgs fa{q_in.view(r), k_in.view(r), v_in.view(r), out_buf.view(r), lse_buf.view(r)};
    if (c.window_alibi) fa.alibi_slopes = alibi.view(r);
    if (c.varlen) fa.cu_seqlens = cu.view(r), fa.max_seqlen = l.max_local;
    Status s = ring_attention_forward(fa, options, c.layout, comms[r], {stream});
    if (s.ok()) {
      RingBackwardArgs ba{q_in.view(r), k_in.view(r), v_in.view(r), out_buf.view(r), dout_in.view(r), lse_buf.view(r),
                          gq.view(r), gk.view(r), gv.view(r)};
      ba.alibi_slopes = fa.alibi_slopes;
      ba.cu_seqlens = fa.cu_seqlens, ba.max_seqlen = fa.max_seqlen;
      s = ring_attention_backward(ba, options, c.layout, comms[r], {stream});
    }
    if (!s.ok()) failures[r] = s.message();
    if (cudaStreamSynchronize(stream) != cudaSuccess) failures[r] += " (stream failed)";
    cudaStreamDestroy(stream);
    outs[r] = out_buf.back();
    lses[r] = lse_buf.back();
    dqs[r] = gq.back();
    dks[r] = gk.back();
    dvs[r] = gv.back();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < c.world; ++r) threads.emplace_back(run_rank, r);
  for (std::thread& t : threads) t.join();
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);

  const double tol = c.dtype == DType::f32 ? 2e-5 : 2e-2;
  for (int r = 0; r < c.world; ++r) {
    ASSERT_TRUE(failures[r].empty()) << "rank " << r << ": " << failures[r];
    const Layout& l = layouts[r];
    EXPECT_LE(max_rel_error(outs[r], gather(out_ref, l, c.varlen)), tol) << "out, rank " << r;
    EXPECT_LE(max_rel_error(lses[r], gather_lse(lse_ref, l, c.varlen)), c.dtype == DType::f32 ? 2e-5 : 5e-3)
        << "lse, rank " << r;
    EXPECT_LE(max_rel_error(dqs[r], gather(dq_ref, l, c.varlen)), 2 * tol) << "dq, rank " << r;
    EXPECT_LE(max_rel_error(dks[r], gather(dk_ref, l, c.varlen)), 2 * tol) << "dk, rank " << r;
    EXPECT_LE(max_rel_error(dvs[r], gather(dv_ref, l, c.varlen)), 2 * tol) << "dv, rank " << r;
  }
}

std::vector<RingCase> ring_cases() {
  std::vector<RingCase> cases;
  for (int world : {1, 2, 4})
    for (RingLayout layout : {RingLayout::zigzag, RingLayout::contiguous})
      for (bool varlen : {false, true})
        for (bool causal : {true, false})
          for (bool window_alibi : {false, true}) {
            if (varlen && window_alibi) continue;  // not offered for varlen (ring_schedule.hpp)
            for (DType dtype : {DType::bf16, DType::f32}) {
              if (dtype == DType::f32 && (window_alibi || layout == RingLayout::contiguous)) continue;
              std::string name = "w" + std::to_string(world) + (layout == RingLayout::zigzag ? "_zigzag" : "_contiguous") +
                                 (varlen ? "_varlen" : "_dense") + (causal ? "_causal" : "_full") +
                                 (window_alibi ? "_window_alibi" : "") + "_" + dtype_name(dtype);
              cases.push_back({name, world, layout, varlen, causal, window_alibi, dtype});
            }
          }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ring, RingGpu, ::testing::ValuesIn(ring_cases()), case_name);

}  // namespace
}  // namespace cuflash::test
