// backend=cudnn: NVIDIA cuDNN's fused attention (SDPA) through the cuDNN
// frontend's graph API. A call: refuse what cuDNN cannot do
// (cudnn_support.cpp), describe the call in cuDNN's terms (sdpa_plan.cpp), get
// its graph from the cache (built on the first call of that shape), then on
// the caller's stream: the index tensors cuDNN reads, the graph, and the
// fix-ups that make cuDNN's results our semantics (cudnn_kernels.cu).
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "backend.hpp"
#include "common/cuda_check.hpp"
#include "common/scratch.hpp"
#include "common/varlen_tail.hpp"
#include "cudnn_kernels.hpp"
#include "cudnn_support.hpp"
#include "device_handle.hpp"
#include "empty_calls.hpp"
#include "graph_cache.hpp"
#include "sdpa_graph.hpp"
#include "sdpa_plan.hpp"

namespace cuflash::detail {

namespace cudnn {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// CUFLASH_CUDNN_LOG=1: one line on stderr per graph built (or refused), with its build time.
bool log_builds() {
  static const bool on = [] {
    const char* value = std::getenv("CUFLASH_CUDNN_LOG");
    return value != nullptr && *value != '\0' && std::string(value) != "0";
  }();
  return on;
}

struct Prepared {
  SdpaPlan plan;
  std::shared_ptr<const BuiltGraph> graph;
  bool keyless = false;  // a forward over no key: no plan, no graph (write_keyless_rows)
};

// The checks, the plan and the (cached) graph of a call: everything that can
// refuse it, before anything is written.
Status prepare(const Problem& problem, Prepared* prepared) {
  CUFLASH_TRY(check_problem(problem));
  // cuDNN builds no graph over zero keys (dense kv_len 0, varlen without key
  // rows or with max_seqlen_k 0, a KV cache without capacity), and such a
  // graph would compute nothing: every query row sees no key.
  if (problem.pass == Pass::forward && !has_keys(problem)) {
    prepared->keyless = true;
    return {};
  }
  prepared->plan = make_plan(problem);
  DeviceGuard guard(problem.device.index);
  CUFLASH_TRY(guard.status());
  const SdpaPlan& plan = prepared->plan;
  const auto build = [&plan](BuiltGraph* built) -> Status {
    const auto start = std::chrono::steady_clock::now();
    HandleLease lease;
    CUFLASH_TRY(lease_handle(plan.device, &lease));
    const Status status = plan.pass == Pass::forward ? build_forward_graph(plan, lease.handle(), built)
                                                     : build_backward_graph(plan, lease.handle(), built);
    if (log_builds()) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (status.ok())
        std::fprintf(stderr, "cuflash cudnn: built %s in %.1f ms (cuDNN workspace %lld bytes)\n",
                     describe(plan).c_str(), ms, static_cast<long long>(built->workspace_bytes));
      else
        std::fprintf(stderr, "cuflash cudnn: %s\n", status.to_string().c_str());
    }
    return status;
  };
  return GraphCache::instance().get(graph_key(plan), build, &prepared->graph);
}

std::size_t workspace_bytes(const Prepared& prepared) {
  if (prepared.keyless) return 0;
  return aligned(static_cast<std::size_t>(prepared.graph->workspace_bytes)) + prepared.plan.scratch.bytes;
}

DeviceLengths lengths_of(const Problem& p) {
  DeviceLengths lengths;
  if (p.layout == Layout::varlen) {
    lengths.cu_q = static_cast<const std::int32_t*>(p.cu_seqlens_q.data);
    lengths.cu_kv = static_cast<const std::int32_t*>(p.cu_seqlens_k.data);
  } else if (p.layout == Layout::kv_cache) {
    lengths.q_len = p.max_q_len;
    lengths.seqlens_kv = static_cast<const std::int32_t*>(p.seqlens_k.data);
  } else {
    lengths.q_len = p.max_q_len;
    lengths.kv_len = p.max_kv_len;
  }
  return lengths;
}

// A [B, S, H, D] (or varlen [T, H, D]) tensor's rows.
RowView rows_of(const TensorView& view) {
  if (view.rank == 3) return {view.data, 0, view.strides[1], view.strides[0], true};
  return {view.data, view.strides[0], view.strides[2], view.strides[1], false};
}

// lse [B, Hq, S] (or varlen [Hq, T]).
RowView lse_rows(const TensorView& lse) {
  if (lse.rank == 2) return {lse.data, 0, lse.strides[0], lse.strides[1], true};
  return {lse.data, lse.strides[0], lse.strides[1], lse.strides[2], false};
}

// The stats in scratch, as the plan laid them out for cuDNN.
RowView scratch_stats_rows(const SdpaPlan& plan, void* stats) {
  const TensorDesc& t = plan.tensor(Slot::stats);
  if (plan.stats == StatsPlace::scratch_ragged) return {stats, 0, t.stride[1], t.stride[2], true};
  return {stats, t.stride[0], t.stride[1], t.stride[2], false};
}

RowSpace q_rows(const Problem& p) {
  if (p.layout == Layout::varlen) return {p.batch, p.heads_q, true, 0, p.q.shape[0]};
  return {p.batch, p.heads_q, false, p.max_q_len, 0};
}

RowSpace kv_rows(const Problem& p) {
  if (p.layout == Layout::varlen) return {p.batch, p.heads_kv, true, 0, p.k.shape[0]};
  return {p.batch, p.heads_kv, false, p.max_kv_len, 0};
}

// One call's run: scratch after cuDNN's workspace, tensors bound to uids.
class Call {
 public:
  Call(const Problem& problem, const Prepared& prepared) : p_(problem), plan_(prepared.plan), graph_(*prepared.graph) {}

  Status acquire(const RunContext& context, cudaStream_t stream) {
    stream_ = stream;
    cudnn_bytes_ = aligned(static_cast<std::size_t>(graph_.workspace_bytes));
    CUFLASH_TRY(scratch_.acquire(context, cudnn_bytes_ + plan_.scratch.bytes, stream));
    return {};
  }

  // Our scratch region (after cuDNN's workspace) at `offset`, or nullptr.
  void* at(std::size_t offset) const {
    if (offset == SdpaPlan::kNone) return nullptr;
    return static_cast<char*>(scratch_.get()) + cudnn_bytes_ + offset;
  }

  // Per-sequence lengths and ragged offsets that cuDNN reads, from cu_seqlens on the device.
  Status write_indices(const DeviceLengths& lengths) {
    if (!plan_.needs_index_kernel()) return {};
    IndexArgs args;
    args.batch = plan_.batch;
    args.lengths = lengths;
    if (plan_.q_lengths != LengthSource::caller_seqlens_k)
      args.q_lengths = static_cast<std::int32_t*>(at(plan_.scratch.q_lengths));
    if (plan_.kv_lengths != LengthSource::caller_seqlens_k)
      args.kv_lengths = static_cast<std::int32_t*>(at(plan_.scratch.kv_lengths));
    for (int s = 0; s < kSlots; ++s) {
      const TensorDesc& t = plan_.tensors[s];
      if (!t.used || !t.ragged) continue;
      args.offsets[args.offset_count++] = {static_cast<std::int64_t*>(at(plan_.scratch.offsets[s])), t.token_stride,
                                           t.side};
    }
    return launch_index_kernel(args, stream_);
  }

  void* stats_address() const {
    if (plan_.stats == StatsPlace::caller) return p_.lse.data;
    return at(plan_.scratch.stats);
  }

  Status execute() {
    VariantPack pack;
    const Slot slots[] = {Slot::q, Slot::k, Slot::v, Slot::o, Slot::dout, Slot::dq, Slot::dk, Slot::dv};
    const TensorView* views[] = {&p_.q, &p_.k, &p_.v, &p_.out, &p_.dout, &p_.dq, &p_.dk, &p_.dv};
    for (int i = 0; i < 8; ++i)
      if (plan_.tensor(slots[i]).used) pack.by_uid[uid::of(slots[i])] = views[i]->data;
    if (plan_.tensor(Slot::stats).used) pack.by_uid[uid::of(Slot::stats)] = stats_address();
    float scale = p_.softmax_scale;  // read by cuDNN on the host at launch
    pack.by_uid[uid::attn_scale] = &scale;
    if (plan_.padding_mask) {
      pack.by_uid[uid::seq_len_q] = at(plan_.scratch.q_lengths);
      pack.by_uid[uid::seq_len_kv] =
          plan_.kv_lengths == LengthSource::caller_seqlens_k ? p_.seqlens_k.data : at(plan_.scratch.kv_lengths);
    }
    if (plan_.paged) pack.by_uid[uid::page_table_k] = pack.by_uid[uid::page_table_v] = p_.block_table.data;
    for (int s = 0; s < kSlots; ++s)
      if (plan_.tensors[s].used && plan_.tensors[s].ragged)
        pack.by_uid[uid::ragged_offset(static_cast<Slot>(s))] = at(plan_.scratch.offsets[s]);

    HandleLease lease;
    CUFLASH_TRY(lease_handle(plan_.device, &lease));
    CUFLASH_TRY(lease.bind(stream_));
    return execute_graph(graph_, lease.handle(), pack, scratch_.get());
  }

 private:
  const Problem& p_;
  const SdpaPlan& plan_;
  const BuiltGraph& graph_;
  Scratch scratch_;
  std::size_t cudnn_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
};

// After the forward: our lse layout from the stats in scratch, and rows that see no key.
// The forward fix-up of the call's out and lse rows.
ForwardFixArgs forward_fix(const Problem& p, const DeviceLengths& lengths, bool fix_empty_rows) {
  ForwardFixArgs fix;
  fix.rows = q_rows(p);
  fix.lengths = lengths;
  fix.window_right = p.window_right;
  fix.head_dim = p.head_dim;
  fix.fix_empty_rows = fix_empty_rows;
  fix.out = rows_of(p.out);
  if (!p.lse.empty()) fix.lse = lse_rows(p.lse);
  return fix;
}

Status finish_forward(const Problem& p, const SdpaPlan& plan, const Call& call, const DeviceLengths& lengths,
                      cudaStream_t stream) {
  const bool stats_in_scratch = plan.stats == StatsPlace::scratch_dense || plan.stats == StatsPlace::scratch_ragged;
  if (!plan.fix_empty_rows && !stats_in_scratch) return {};
  ForwardFixArgs fix = forward_fix(p, lengths, plan.fix_empty_rows);
  if (stats_in_scratch) fix.stats = scratch_stats_rows(plan, call.at(plan.scratch.stats));
  return launch_forward_fix(fix, stream);
}

// Before the backward: the caller's lse in cuDNN's layout, -inf made +inf.
Status prepare_backward(const Problem& p, const SdpaPlan& plan, const Call& call, const DeviceLengths& lengths,
                        cudaStream_t stream) {
  if (plan.stats != StatsPlace::scratch_dense && plan.stats != StatsPlace::scratch_ragged) return {};
  BackwardStatsArgs stats;
  stats.rows = q_rows(p);
  stats.lengths = lengths;
  stats.lse = lse_rows(p.lse);
  stats.stats = scratch_stats_rows(plan, call.at(plan.scratch.stats));
  return launch_backward_stats(stats, stream);
}

// After the backward: zero gradients where no score contributes, and varlen
// rows after the last sequence (they belong to none, yet the backward writes
// every gradient element).
Status finish_backward(const Problem& p, const SdpaPlan& plan, const DeviceLengths& lengths, cudaStream_t stream) {
  BackwardFixArgs fix;
  fix.lengths = lengths;
  fix.window_left = p.window_left;
  fix.window_right = p.window_right;
  fix.head_dim = p.head_dim;
  if (plan.fix_empty_rows) {
    fix.rows = q_rows(p);
    fix.side = Side::q;
    fix.first = rows_of(p.dq);
    CUFLASH_TRY(launch_backward_fix(fix, stream));
  }
  if (plan.fix_unseen_keys) {
    fix.rows = kv_rows(p);
    fix.side = Side::kv;
    fix.first = rows_of(p.dk);
    fix.second = rows_of(p.dv);
    CUFLASH_TRY(launch_backward_fix(fix, stream));
  }
  if (p.layout != Layout::varlen) return {};
  CUFLASH_TRY(zero_rows_after_sequences(p.dq, p.cu_seqlens_q.data, p.batch, stream));
  CUFLASH_TRY(zero_rows_after_sequences(p.dk, p.cu_seqlens_k.data, p.batch, stream));
  return zero_rows_after_sequences(p.dv, p.cu_seqlens_k.data, p.batch, stream);
}

// A forward over no key: every row of every sequence gets out = 0 and lse =
// -inf, from the forward fix-up alone (every kv length 0).
Status write_keyless_rows(const Problem& p, cudaStream_t stream) {
  DeviceLengths lengths;
  if (p.layout == Layout::varlen) lengths.cu_q = static_cast<const std::int32_t*>(p.cu_seqlens_q.data);
  lengths.q_len = p.max_q_len;
  return launch_forward_fix(forward_fix(p, lengths, true), stream);
}

// One call on the caller's stream: index tensors, (backward: stats), the graph, fix-ups.
Status run(const Problem& p, const Prepared& prepared, const RunContext& context) {
  const SdpaPlan& plan = prepared.plan;
  DeviceGuard guard(p.device.index);
  CUFLASH_TRY(guard.status());
  const auto stream = static_cast<cudaStream_t>(context.stream);
  if (prepared.keyless) return write_keyless_rows(p, stream);
  Call call(p, prepared);
  CUFLASH_TRY(call.acquire(context, stream));
  const DeviceLengths lengths = lengths_of(p);
  CUFLASH_TRY(call.write_indices(lengths));
  if (p.pass == Pass::backward) CUFLASH_TRY(prepare_backward(p, plan, call, lengths, stream));
  CUFLASH_TRY(call.execute());
  return p.pass == Pass::forward ? finish_forward(p, plan, call, lengths, stream)
                                 : finish_backward(p, plan, lengths, stream);
}

class CudnnBackend final : public BackendImpl {
 public:
  Backend kind() const override { return Backend::cudnn; }

  bool available() const override {
    static const bool usable = [] {
      int count = 0;
      if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return false;
      }
      return cudnnGetVersion() >= 90000;
    }();
    return usable;
  }

  Status supports(const Problem& problem) const override {
    Prepared prepared;
    return prepare(problem, &prepared);
  }

  // merge_states is no attention graph: the cuda backend's kernel serves both.
  Status supports_merge(const MergeProblem& problem) const override {
    BackendImpl* cuda = cuda_backend();
    if (cuda == nullptr) return Status::unsupported("backend cudnn: merge_states needs the cuda backend's kernel");
    return cuda->supports_merge(problem);
  }

  Status workspace_size(const Problem& problem, std::size_t* bytes) const override {
    Prepared prepared;
    CUFLASH_TRY(prepare(problem, &prepared));
    *bytes = workspace_bytes(prepared);
    return {};
  }

  Status forward(const Problem& problem, const RunContext& context) override {
    Prepared prepared;
    CUFLASH_TRY(prepare(problem, &prepared));
    return run(problem, prepared, context);
  }

  Status backward(const Problem& problem, const RunContext& context) override {
    Prepared prepared;
    CUFLASH_TRY(prepare(problem, &prepared));
    return run(problem, prepared, context);
  }

  Status merge_states(const MergeProblem& problem, const RunContext& context) override {
    BackendImpl* cuda = cuda_backend();
    if (cuda == nullptr) return Status::unsupported("backend cudnn: merge_states needs the cuda backend's kernel");
    return cuda->merge_states(problem, context);
  }
};

}  // namespace
}  // namespace cudnn

BackendImpl* cudnn_backend() {
  static cudnn::CudnnBackend backend;
  return &backend;
}

}  // namespace cuflash::detail
