// Calls with empty tensors (docs/semantics.md, "Empty tensors"), written once
// for every backend: tests/cpu/empty_tensors_test.cpp runs them on backend cpu
// in host memory, tests/gpu/empty_tensors_gpu_test.cpp on backends cuda and
// cudnn in GPU memory. Outputs start poisoned with NaN: what must be written
// (out = 0 and lse = -inf for rows that see no key, zero gradients) is checked
// element by element, and what must not be written (nothing, when there is no
// row; varlen rows after the last sequence) must still hold every poisoned
// byte. Each call also runs with the data pointers of its empty tensors set to
// null, as torch passes them.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_tensors.hpp"
#include "cuflash/cuflash.hpp"

namespace cuflash::test::empty {

inline constexpr std::int64_t kDim = 64;

// Where a call's tensors live while it runs.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual Device device() const = 0;
  // The view the call gets of `tensor` (for the GPU: of a copy of its bytes).
  virtual TensorView place(HostTensor& tensor) = 0;
  // After the call: every placed tensor's bytes back into its HostTensor.
  virtual void fetch() = 0;
};

class HostMemory final : public Memory {
 public:
  Device device() const override { return Device::host(); }
  TensorView place(HostTensor& tensor) override { return tensor.view(); }
  void fetch() override {}
};

// One backend in one memory; null_empty: empty tensors are passed with null data.
struct Target {
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  std::function<std::unique_ptr<Memory>()> make_memory;
  bool null_empty = false;
  // What the backend's kernels run, for the cases that reach them: KV-cache
  // forwards with query rows, appends of k_new/v_new, KV caches with more
  // than one query per sequence.
  bool cache_rows = true;
  bool appends = true;
  bool multi_query_cache = true;

  AttentionOptions options() const {
    AttentionOptions options;
    options.backend = backend;
    return options;
  }
  std::string describe() const {
    return std::string(backend_name(backend)) + " " + dtype_name(dtype) + (null_empty ? ", empty views null" : "");
  }
};

// One call's tensors, placed in its memory.
class Call {
 public:
  explicit Call(const Target& target) : target_(target), memory_(target.make_memory()) {}

  // Inputs: fixed pseudo-random values (no case here reads them for a result).
  HostTensor input(std::vector<std::int64_t> shape, DType dtype) {
    HostTensor tensor(dtype, std::move(shape));
    tensor.fill_normal(engine_);
    return tensor;
  }
  HostTensor input(std::vector<std::int64_t> shape) { return input(std::move(shape), target_.dtype); }
  static HostTensor poisoned(std::vector<std::int64_t> shape, DType dtype) {
    HostTensor tensor(dtype, std::move(shape));
    tensor.poison();
    return tensor;
  }
  HostTensor output(std::vector<std::int64_t> shape) { return poisoned(std::move(shape), target_.dtype); }
  static HostTensor lse(std::vector<std::int64_t> shape) { return poisoned(std::move(shape), DType::f32); }
  static HostTensor indices(const std::vector<std::int32_t>& values, std::vector<std::int64_t> shape) {
    return HostTensor::from_i32(values, std::move(shape));
  }

  TensorView view(HostTensor& tensor) {
    TensorView v = memory_->place(tensor);
    if (target_.null_empty && tensor.numel() == 0) v.data = nullptr;
    return v;
  }
  void fetch() { memory_->fetch(); }

 private:
  const Target& target_;
  std::unique_ptr<Memory> memory_;
  std::mt19937 engine_{20240611u};
};

// Every byte of the allocation still holds the poison: nothing was written.
inline ::testing::AssertionResult untouched(const HostTensor& tensor, const char* name) {
  HostTensor poisoned = tensor;
  poisoned.poison();
  if (same_bytes(tensor, poisoned)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << name << ": written, but the call had nothing to write";
}

// Logical elements [first, end) all equal `value` (-inf included).
inline ::testing::AssertionResult all_equal(const HostTensor& tensor, const char* name, double value,
                                            std::int64_t first = 0, std::int64_t end = -1) {
  if (end < 0) end = tensor.numel();
  for (std::int64_t i = first; i < end; ++i)
    if (!(tensor.get(i) == value))
      return ::testing::AssertionFailure() << name << "[" << i << "] (flat) = " << tensor.get(i) << ", expected "
                                           << value;
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult ok(const Status& status) {
  if (status.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << status.to_string();
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Dense extents; head_dim is kDim.
struct Dense {
  std::int64_t batch, q_len, kv_len, heads_q, heads_kv;
};

inline std::string describe(const Dense& d) {
  return "B=" + std::to_string(d.batch) + " Sq=" + std::to_string(d.q_len) + " Sk=" + std::to_string(d.kv_len) +
         " Hq=" + std::to_string(d.heads_q) + " Hk=" + std::to_string(d.heads_kv);
}

// Dense forward: with no query row nothing is written and no workspace is
// needed; with rows but no key, out = 0 and lse = -inf (causal too: the
// bottom-right offset is then negative).
inline void dense_forward(const Target& target, const Dense& d, bool causal = false) {
  SCOPED_TRACE(target.describe() + ", dense forward " + describe(d) + (causal ? " causal" : ""));
  Call call(target);
  HostTensor q = call.input({d.batch, d.q_len, d.heads_q, kDim});
  HostTensor k = call.input({d.batch, d.kv_len, d.heads_kv, kDim});
  HostTensor v = call.input({d.batch, d.kv_len, d.heads_kv, kDim});
  HostTensor out = call.output({d.batch, d.q_len, d.heads_q, kDim});
  HostTensor lse = Call::lse({d.batch, d.heads_q, d.q_len});
  ForwardArgs args;
  args.q = call.view(q);
  args.k = call.view(k);
  args.v = call.view(v);
  args.out = call.view(out);
  args.lse = call.view(lse);
  AttentionOptions options = target.options();
  options.causal = causal;
  std::size_t bytes = 1;
  ASSERT_TRUE(ok(forward_workspace_size(args, options, &bytes)));
  ASSERT_TRUE(ok(attention_forward(args, options)));
  call.fetch();
  if (d.batch == 0 || d.q_len == 0 || d.heads_q == 0) {
    EXPECT_EQ(bytes, 0u);
    EXPECT_TRUE(untouched(out, "out"));
    EXPECT_TRUE(untouched(lse, "lse"));
  } else {
    EXPECT_TRUE(all_equal(out, "out", 0.0));
    EXPECT_TRUE(all_equal(lse, "lse", kNegInf));
  }
}

// A backward call whose rows see no key (lse = -inf), its tensors placed in
// `call`'s memory and bound into `args`; dq, dk, dv poisoned. Not movable:
// `call` keeps the addresses of the tensors it placed.
struct ZeroBackward {
  ZeroBackward(Call& call, const std::vector<std::int64_t>& q_shape, const std::vector<std::int64_t>& kv_shape,
               const std::vector<std::int64_t>& lse_shape)
      : q(call.input(q_shape)), k(call.input(kv_shape)), v(call.input(kv_shape)), out(call.input(q_shape)),
        dout(call.input(q_shape)), lse(call.input(lse_shape, DType::f32)), dq(call.output(q_shape)),
        dk(call.output(kv_shape)), dv(call.output(kv_shape)) {
    lse.fill(-std::numeric_limits<double>::infinity());
    args.q = call.view(q);
    args.k = call.view(k);
    args.v = call.view(v);
    args.out = call.view(out);
    args.dout = call.view(dout);
    args.lse = call.view(lse);
    args.dq = call.view(dq);
    args.dk = call.view(dk);
    args.dv = call.view(dv);
  }
  ZeroBackward(const ZeroBackward&) = delete;
  ZeroBackward& operator=(const ZeroBackward&) = delete;

  // Runs it: no workspace, and every element of dq, dk, dv written as 0.
  void expect_zero_gradients(const Target& target, Call& call) {
    std::size_t bytes = 1;
    ASSERT_TRUE(ok(backward_workspace_size(args, target.options(), &bytes)));
    EXPECT_EQ(bytes, 0u);
    ASSERT_TRUE(ok(attention_backward(args, target.options())));
    call.fetch();
    for (const auto& [name, grad] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}}) {
      if (grad->numel() == 0) EXPECT_TRUE(untouched(*grad, name));
      else EXPECT_TRUE(all_equal(*grad, name, 0.0));
    }
  }

  HostTensor q, k, v, out, dout, lse, dq, dk, dv;
  BackwardArgs args;
};

// Dense backward without a (query, key) pair: every element of dq, dk, dv is
// 0 (over the poison), and no workspace is needed.
inline void dense_backward(const Target& target, const Dense& d) {
  SCOPED_TRACE(target.describe() + ", dense backward " + describe(d));
  Call call(target);
  ZeroBackward backward(call, {d.batch, d.q_len, d.heads_q, kDim}, {d.batch, d.kv_len, d.heads_kv, kDim},
                        {d.batch, d.heads_q, d.q_len});
  backward.expect_zero_gradients(target, call);
}

// A varlen batch: cu_seqlens and the packed rows of q (may exceed cu_q[B])
// and of k; max_seqlen as declared.
struct Varlen {
  std::vector<std::int32_t> cu_q, cu_k;
  std::int64_t total_q, total_k;
  int max_q, max_k;
  std::int64_t heads_q = 4, heads_kv = 2;
};

inline std::string describe(const Varlen& c) {
  const auto list = [](const std::vector<std::int32_t>& values) {
    std::string text = "[";
    for (std::size_t i = 0; i < values.size(); ++i) text += (i ? "," : "") + std::to_string(values[i]);
    return text + "]";
  };
  return "cu_q=" + list(c.cu_q) + " cu_k=" + list(c.cu_k) + " total_q=" + std::to_string(c.total_q) +
         " total_k=" + std::to_string(c.total_k) + " max_q=" + std::to_string(c.max_q) +
         " max_k=" + std::to_string(c.max_k);
}

// Varlen forward where no sequence has a key: rows of sequences get out = 0
// and lse = -inf, packed rows after cu_q[B] keep their poison.
inline void varlen_forward(const Target& target, const Varlen& c) {
  SCOPED_TRACE(target.describe() + ", varlen forward " + describe(c));
  const auto entries = static_cast<std::int64_t>(c.cu_q.size());
  Call call(target);
  HostTensor q = call.input({c.total_q, c.heads_q, kDim});
  HostTensor k = call.input({c.total_k, c.heads_kv, kDim});
  HostTensor v = call.input({c.total_k, c.heads_kv, kDim});
  HostTensor cu_q = Call::indices(c.cu_q, {entries});
  HostTensor cu_k = Call::indices(c.cu_k, {entries});
  HostTensor out = call.output({c.total_q, c.heads_q, kDim});
  HostTensor lse = Call::lse({c.heads_q, c.total_q});
  ForwardArgs args;
  args.q = call.view(q);
  args.k = call.view(k);
  args.v = call.view(v);
  args.out = call.view(out);
  args.lse = call.view(lse);
  args.varlen.cu_seqlens_q = call.view(cu_q);
  args.varlen.cu_seqlens_k = call.view(cu_k);
  args.varlen.max_seqlen_q = c.max_q;
  args.varlen.max_seqlen_k = c.max_k;
  std::size_t bytes = 1;
  ASSERT_TRUE(ok(forward_workspace_size(args, target.options(), &bytes)));
  ASSERT_TRUE(ok(attention_forward(args, target.options())));
  call.fetch();
  const std::int64_t rows = c.cu_q.back();
  if (rows == 0) {
    EXPECT_EQ(bytes, 0u);
    EXPECT_TRUE(untouched(out, "out"));
    EXPECT_TRUE(untouched(lse, "lse"));
    return;
  }
  ASSERT_EQ(c.cu_k.back(), 0) << "these cases have no key";
  EXPECT_TRUE(all_equal(out, "out", 0.0, 0, rows * c.heads_q * kDim));
  EXPECT_EQ(out.count_nan(), (c.total_q - rows) * c.heads_q * kDim) << "out: rows after cu_seqlens_q[B] were written";
  for (std::int64_t h = 0; h < c.heads_q; ++h)
    EXPECT_TRUE(all_equal(lse, "lse", kNegInf, h * c.total_q, h * c.total_q + rows));
  EXPECT_EQ(lse.count_nan(), (c.total_q - rows) * c.heads_q) << "lse: rows after cu_seqlens_q[B] were written";
}

// Varlen backward without a (query, key) pair: every element of dq, dk, dv
// is 0, packed rows after the last sequence included.
inline void varlen_backward(const Target& target, const Varlen& c) {
  SCOPED_TRACE(target.describe() + ", varlen backward " + describe(c));
  const auto entries = static_cast<std::int64_t>(c.cu_q.size());
  Call call(target);
  ZeroBackward backward(call, {c.total_q, c.heads_q, kDim}, {c.total_k, c.heads_kv, kDim}, {c.heads_q, c.total_q});
  HostTensor cu_q = Call::indices(c.cu_q, {entries});
  HostTensor cu_k = Call::indices(c.cu_k, {entries});
  backward.args.varlen.cu_seqlens_q = call.view(cu_q);
  backward.args.varlen.cu_seqlens_k = call.view(cu_k);
  backward.args.varlen.max_seqlen_q = c.max_q;
  backward.args.varlen.max_seqlen_k = c.max_k;
  backward.expect_zero_gradients(target, call);
}

// A KV cache: contiguous [batch, capacity, Hk, D] or paged [num_pages,
// page_size, Hk, D] with a block table [batch, max_pages] (page_size then in
// `capacity`); k_new/v_new rows when new_len > 0.
struct Cache {
  std::int64_t batch, q_len;
  bool paged;
  std::int64_t capacity;  // contiguous: keys per sequence; paged: page_size
  std::int64_t num_pages = 0, max_pages = 0;
  std::vector<std::int32_t> seqlens;
  std::int64_t new_len = 0;
  std::int64_t heads_q = 4, heads_kv = 2;
};

inline std::string describe(const Cache& c) {
  return std::string(c.paged ? "paged" : "contiguous") + " B=" + std::to_string(c.batch) +
         " q_len=" + std::to_string(c.q_len) + (c.paged ? " page_size=" : " capacity=") + std::to_string(c.capacity) +
         (c.paged ? " pages=" + std::to_string(c.num_pages) + " max_pages=" + std::to_string(c.max_pages) : "") +
         " new_len=" + std::to_string(c.new_len) + " Hq=" + std::to_string(c.heads_q);
}

// KV-cache forward of a cache that holds no key (or of no query row):
// out = 0 and lse = -inf on every row, nothing written without rows. An
// append still lands in the cache when there is no query row.
inline void cache_forward(const Target& target, const Cache& c) {
  SCOPED_TRACE(target.describe() + ", KV-cache forward " + describe(c));
  Call call(target);
  const std::vector<std::int64_t> cache_shape = c.paged ? std::vector<std::int64_t>{c.num_pages, c.capacity, c.heads_kv, kDim}
                                                        : std::vector<std::int64_t>{c.batch, c.capacity, c.heads_kv, kDim};
  HostTensor q = call.input({c.batch, c.q_len, c.heads_q, kDim});
  HostTensor k = call.input(cache_shape);
  HostTensor v = call.input(cache_shape);
  HostTensor seqlens = Call::indices(c.seqlens, {c.batch});
  std::vector<std::int32_t> table(static_cast<std::size_t>(c.batch * c.max_pages));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  HostTensor block_table = Call::indices(table, {c.batch, c.max_pages});
  HostTensor k_new = call.input({c.batch, c.new_len, c.heads_kv, kDim});
  HostTensor v_new = call.input({c.batch, c.new_len, c.heads_kv, kDim});
  HostTensor out = call.output({c.batch, c.q_len, c.heads_q, kDim});
  HostTensor lse = Call::lse({c.batch, c.heads_q, c.q_len});
  ForwardArgs args;
  args.q = call.view(q);
  args.k = call.view(k);
  args.v = call.view(v);
  args.out = call.view(out);
  args.lse = call.view(lse);
  args.kv_cache.seqlens_k = call.view(seqlens);
  if (c.paged) args.kv_cache.block_table = call.view(block_table);
  if (c.new_len > 0) {
    args.kv_cache.k_new = call.view(k_new);
    args.kv_cache.v_new = call.view(v_new);
  }
  std::size_t bytes = 1;
  ASSERT_TRUE(ok(forward_workspace_size(args, target.options(), &bytes)));
  ASSERT_TRUE(ok(attention_forward(args, target.options())));
  call.fetch();
  if (c.batch == 0 || c.q_len == 0 || c.heads_q == 0) {
    EXPECT_TRUE(untouched(out, "out"));
    EXPECT_TRUE(untouched(lse, "lse"));
  } else {
    for (std::int32_t cached : c.seqlens) ASSERT_EQ(cached + c.new_len, 0) << "these cases attend to no key";
    EXPECT_TRUE(all_equal(out, "out", 0.0));
    EXPECT_TRUE(all_equal(lse, "lse", kNegInf));
  }
  if (c.new_len == 0 || c.batch == 0) {
    if (c.batch == 0 || c.q_len == 0 || c.heads_q == 0) {
      EXPECT_EQ(bytes, 0u);
    }
    return;
  }
  ASSERT_FALSE(c.paged) << "appends are checked on contiguous caches here";
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t n = 0; n < c.new_len; ++n)
      for (std::int64_t i = 0; i < c.heads_kv * kDim; ++i) {
        const std::int64_t from = (b * c.new_len + n) * c.heads_kv * kDim + i;
        const std::int64_t to = (b * c.capacity + c.seqlens[b] + n) * c.heads_kv * kDim + i;
        ASSERT_EQ(k.get(to), k_new.get(from)) << "k: append of sequence " << b << " row " << n;
        ASSERT_EQ(v.get(to), v_new.get(from)) << "v: append of sequence " << b << " row " << n;
      }
}

// KV-cache backward without a (query, key) pair: dq, dk, dv all 0.
inline void cache_backward(const Target& target, const Cache& c) {
  SCOPED_TRACE(target.describe() + ", KV-cache backward " + describe(c));
  Call call(target);
  const std::vector<std::int64_t> cache_shape = c.paged ? std::vector<std::int64_t>{c.num_pages, c.capacity, c.heads_kv, kDim}
                                                        : std::vector<std::int64_t>{c.batch, c.capacity, c.heads_kv, kDim};
  ZeroBackward backward(call, {c.batch, c.q_len, c.heads_q, kDim}, cache_shape, {c.batch, c.heads_q, c.q_len});
  HostTensor seqlens = Call::indices(c.seqlens, {c.batch});
  std::vector<std::int32_t> table(static_cast<std::size_t>(c.batch * c.max_pages), 0);
  HostTensor block_table = Call::indices(table, {c.batch, c.max_pages});
  backward.args.kv_cache.seqlens_k = call.view(seqlens);
  if (c.paged) backward.args.kv_cache.block_table = call.view(block_table);
  backward.expect_zero_gradients(target, call);
}

// merge_states of no rows: ok, nothing written.
inline void merge_empty(const Target& target, std::int64_t batch, std::int64_t seq, std::int64_t heads) {
  SCOPED_TRACE(target.describe() + ", merge_states B=" + std::to_string(batch) + " S=" + std::to_string(seq) +
               " H=" + std::to_string(heads));
  Call call(target);
  HostTensor out_a = call.input({batch, seq, heads, kDim});
  HostTensor out_b = call.input({batch, seq, heads, kDim});
  HostTensor lse_a = call.input({batch, heads, seq}, DType::f32);
  HostTensor lse_b = call.input({batch, heads, seq}, DType::f32);
  HostTensor out = call.output({batch, seq, heads, kDim});
  HostTensor lse = Call::lse({batch, heads, seq});
  MergeArgs args;
  args.out_a = call.view(out_a);
  args.out_b = call.view(out_b);
  args.lse_a = call.view(lse_a);
  args.lse_b = call.view(lse_b);
  args.out = call.view(out);
  args.lse = call.view(lse);
  ASSERT_TRUE(ok(merge_states(args, target.backend)));
  call.fetch();
  EXPECT_TRUE(untouched(out, "out"));
  EXPECT_TRUE(untouched(lse, "lse"));
}

// Every case above that the target's backend runs.
inline void run_all(const Target& target) {
  // Nothing to write.
  dense_forward(target, {0, 5, 7, 4, 2});
  dense_forward(target, {2, 0, 7, 4, 2});
  dense_forward(target, {2, 5, 7, 0, 2});
  dense_forward(target, {2, 5, 7, 0, 0});
  dense_forward(target, {0, 0, 0, 4, 2});
  // Rows without a key: out = 0, lse = -inf.
  dense_forward(target, {2, 5, 0, 4, 2});
  dense_forward(target, {2, 5, 0, 4, 2}, true);
  dense_forward(target, {1, 1, 0, 4, 4});

  dense_backward(target, {0, 5, 7, 4, 2});
  dense_backward(target, {2, 0, 7, 4, 2});  // dk = dv = 0
  dense_backward(target, {2, 5, 0, 4, 2});  // dq = 0
  dense_backward(target, {2, 5, 7, 0, 2});  // no query head: dk = dv = 0
  dense_backward(target, {2, 0, 0, 4, 2});

  // Varlen: no sequence; no query row; no key (with a packed row after the last sequence).
  varlen_forward(target, {{0}, {0}, 0, 0, 0, 0});
  varlen_forward(target, {{0}, {0}, 3, 2, 0, 0});
  varlen_forward(target, {{0, 0, 0}, {0, 3, 7}, 0, 7, 0, 4});
  varlen_forward(target, {{0, 0, 0}, {0, 3, 7}, 2, 7, 0, 4});
  varlen_forward(target, {{0, 3, 5}, {0, 0, 0}, 6, 0, 3, 0});
  varlen_forward(target, {{0, 3, 5}, {0, 0, 0}, 5, 3, 3, 0});

  varlen_backward(target, {{0}, {0}, 0, 0, 0, 0});
  varlen_backward(target, {{0}, {0}, 3, 2, 0, 0});
  varlen_backward(target, {{0, 0, 0}, {0, 3, 7}, 0, 7, 0, 4});
  varlen_backward(target, {{0, 3, 5}, {0, 0, 0}, 6, 0, 3, 0});
  varlen_backward(target, {{0, 3, 5}, {0, 0, 0}, 6, 3, 3, 0});

  // KV caches: no sequence (contiguous, paged, a block table of no column);
  // caches that hold no key; no query.
  cache_forward(target, {0, 1, false, 16, 0, 0, {}});
  cache_forward(target, {0, 1, true, 16, 4, 2, {}});
  cache_forward(target, {0, 1, true, 16, 4, 0, {}});
  cache_forward(target, {2, 0, false, 16, 0, 0, {4, 9}});
  cache_forward(target, {0, 1, false, 16, 0, 0, {}, 2});  // an append of no sequence
  if (target.cache_rows) {
    cache_forward(target, {2, 1, false, 0, 0, 0, {0, 0}});
    cache_forward(target, {2, 1, true, 16, 0, 2, {0, 0}});
  }
  if (target.cache_rows && target.multi_query_cache) cache_forward(target, {2, 3, false, 0, 0, 0, {0, 0}});
  if (target.cache_rows && target.appends) {
    cache_forward(target, {2, 0, false, 16, 0, 0, {4, 9}, 3});  // no query: the append alone
    Cache no_query_heads{2, 1, false, 16, 0, 0, {1, 0}, 2};
    no_query_heads.heads_q = 0;
    cache_forward(target, no_query_heads);
  }

  cache_backward(target, {0, 1, false, 16, 0, 0, {}});
  cache_backward(target, {0, 1, true, 16, 4, 2, {}});
  cache_backward(target, {2, 1, false, 0, 0, 0, {0, 0}});
  cache_backward(target, {2, 1, true, 16, 0, 2, {0, 0}});

  merge_empty(target, 0, 3, 2);
  merge_empty(target, 2, 0, 2);
  merge_empty(target, 2, 3, 0);
}

}  // namespace cuflash::test::empty
