// Ring attention over NCCL (include/cuflash/ring.hpp, docs/ring.md).
#include "cuflash/ring.hpp"

#include "cuflash/merge_states.hpp"

#include <string>

#if CUFLASH_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "common/cuda_check.hpp"
#include "ring_kernels.hpp"
#endif

namespace cuflash {

#if !CUFLASH_WITH_NCCL

bool ring_attention_available() { return false; }

Status ring_attention_forward(const RingForwardArgs&, const AttentionOptions&, RingLayout, ncclComm_t,
                              const RunContext&) {
  return Status::unsupported("ring_attention_forward: this build of cuflash has no NCCL (configure with NCCL found)");
}
Status ring_attention_backward(const RingBackwardArgs&, const AttentionOptions&, RingLayout, ncclComm_t,
                               const RunContext&) {
  return Status::unsupported("ring_attention_backward: this build of cuflash has no NCCL (configure with NCCL found)");
}

#else

namespace {

using detail::cuda_status;
using detail::DeviceGuard;

#define RING_TRY(expr)                        \
  do {                                        \
    const ::cuflash::Status status_ = (expr); \
    if (!status_.ok()) return status_;        \
  } while (0)

Status nccl_status(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return {};
  return {StatusCode::cuda_error, std::string("NCCL ") + what + ": " + ncclGetErrorString(result)};
}

// The communication stream of a device: made once, kept for the process.
Status comm_stream_of(int device, cudaStream_t* stream) {
  static std::mutex mutex;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(device);
  if (found == streams.end()) {
    cudaStream_t made = nullptr;
    RING_TRY(cuda_status(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking), "ring: communication stream"));
    found = streams.emplace(device, made).first;
  }
  *stream = found->second;
  return {};
}

// Device scratch of one call from the caller's allocator or cudaMallocAsync,
// handed back in stream order on the compute stream at the end of the call
// (after everything that reads it, the communication included, has been
// ordered before it).
class Scratch {
 public:
  Scratch(const RunContext& context, cudaStream_t stream) : context_(context), stream_(stream) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    for (void* block : blocks_) {
      if (context_.allocator.given())
        context_.allocator.release(block, stream_, context_.allocator.state);
      else
        (void)cudaFreeAsync(block, stream_);
    }
  }
  Status get(std::size_t bytes, void** pointer) {
    bytes = bytes == 0 ? 256 : (bytes + 255) / 256 * 256;
    void* block = nullptr;
    if (context_.allocator.given()) {
      block = context_.allocator.allocate(bytes, stream_, context_.allocator.state);
      if (block == nullptr) return {StatusCode::cuda_error, "ring: the workspace allocator could not give memory"};
    } else {
      RING_TRY(cuda_status(cudaMallocAsync(&block, bytes, stream_), "ring: cudaMallocAsync"));
    }
    blocks_.push_back(block);
    *pointer = block;
    return {};
  }

 private:
  const RunContext& context_;
  cudaStream_t stream_;
  std::vector<void*> blocks_;
};

class Events {
 public:
  ~Events() {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  Status make(cudaEvent_t* event) {
    RING_TRY(cuda_status(cudaEventCreateWithFlags(event, cudaEventDisableTiming), "ring: event"));
    events_.push_back(*event);
    return {};
  }

 private:
  std::vector<cudaEvent_t> events_;
};

// A contiguous view of `like`'s shape over `data` with another dtype.
TensorView contiguous_like(const TensorView& like, void* data, DType dtype) {
  TensorView v;
  v.data = data;
  v.dtype = dtype;
  v.device = like.device;
  v.rank = like.rank;
  std::int64_t stride = 1;
  for (int d = like.rank - 1; d >= 0; --d) {
    v.shape[d] = like.shape[d];
    v.strides[d] = stride;
    stride *= like.shape[d];
  }
  return v;
}

// Rows [first, first + count) along dimension `dim`.
TensorView rows(TensorView v, int dim, std::int64_t first, std::int64_t count) {
  v.data = static_cast<char*>(v.data) + first * v.strides[dim] * static_cast<std::int64_t>(dtype_size(v.dtype));
  v.shape[dim] = count;
  return v;
}

// merge_states takes [B, S, H, D] / [B, H, S]: varlen [T, H, D] / [H, T] as B = 1.
TensorView as_batch_of_one(const TensorView& v) {
  TensorView b = v;
  b.rank = v.rank + 1;
  for (int d = v.rank; d > 0; --d) {
    b.shape[d] = v.shape[d - 1];
    b.strides[d] = v.strides[d - 1];
  }
  b.shape[0] = 1;
  b.strides[0] = 0;
  return b;
}

// lse [H, T] seen as rows [T, H, 1], for the row permutation.
TensorView lse_as_rows(const TensorView& lse) {
  TensorView r = lse;
  r.rank = 3;
  r.shape[0] = lse.shape[1], r.strides[0] = lse.strides[1];
  r.shape[1] = lse.shape[0], r.strides[1] = lse.strides[0];
  r.shape[2] = 1, r.strides[2] = 1;
  return r;
}

std::size_t bytes_of(const TensorView& v) { return static_cast<std::size_t>(v.numel()) * dtype_size(v.dtype); }

// What one call of the ring knows about its shards.
struct RingShape {
  int world = 1, rank = 0, chunks = 1;
  bool varlen = false;
  int batch = 0;             // varlen: sequences
  std::int64_t rows = 0;     // local rows per sequence (dense) or packed rows (varlen)
  std::int64_t chunk_rows = 0;  // dense: rows per chunk; varlen: packed rows per chunk
  int row_dim = 1, lse_row_dim = 2;  // dense; varlen 0 and 1
  int max_chunk = 0;                 // varlen: longest chunk
};

Status check_shards(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                    int max_seqlen, const AttentionOptions& options, RingLayout layout, ncclComm_t comm,
                    RingShape* shape) {
  if (comm == nullptr) return Status::invalid("comm: expected an NCCL communicator, got null");
  RING_TRY(nccl_status(ncclCommCount(comm, &shape->world), "ncclCommCount"));
  RING_TRY(nccl_status(ncclCommUserRank(comm, &shape->rank), "ncclCommUserRank"));
  if (q.empty() || k.empty() || v.empty()) return Status::invalid("q, k, v: ring attention needs all three");
  if (q.device.kind != DeviceKind::cuda)
    return Status::invalid("q: ring attention over NCCL takes CUDA tensors (the CPU runs the Python ring on gloo)");
  if (options.diagonal_offset)
    return Status::invalid("diagonal_offset: ring attention sets each step's offset itself; leave it unset");
  if (options.dropout_p != 0.0f) return Status::unsupported("dropout_p: ring attention has no dropout");
  for (const auto& [name, view] : {std::pair{"k", k}, std::pair{"v", v}})
    if (!view.is_contiguous())
      return Status::invalid(std::string(name) + ": ring attention sends it as one block; expected a contiguous tensor");
  shape->chunks = ring_chunks_per_rank(layout);
  shape->varlen = !cu_seqlens.empty();
  if (shape->varlen) {
    if (q.rank != 3) return Status::invalid("q: varlen ring attention expects [total_q, heads_q, head_dim]");
    if (k.shape[0] != q.shape[0])
      return Status::invalid("k: ring attention is self-attention: expected as many rows as q (" +
                             std::to_string(q.shape[0]) + "), got " + std::to_string(k.shape[0]));
    if (cu_seqlens.dtype != DType::i32 || cu_seqlens.rank != 1 || cu_seqlens.shape[0] < 1 ||
        cu_seqlens.device != q.device)
      return Status::invalid("cu_seqlens: expected int32 [batch+1] on q's device");
    shape->batch = static_cast<int>(cu_seqlens.shape[0] - 1);
    shape->rows = q.shape[0];
    shape->row_dim = 0;
    shape->lse_row_dim = 1;
    if (max_seqlen % shape->chunks != 0)
      return Status::invalid("max_seqlen: each local sequence holds " + std::to_string(shape->chunks) +
                             " equal chunks; expected a multiple of it, got " + std::to_string(max_seqlen));
    shape->max_chunk = max_seqlen / shape->chunks;
    if (options.check_index_contents) {
      std::vector<std::int32_t> host(cu_seqlens.shape[0]);
      RING_TRY(cuda_status(cudaMemcpy(host.data(), cu_seqlens.data, host.size() * sizeof(std::int32_t),
                                      cudaMemcpyDeviceToHost),
                           "ring: reading cu_seqlens"));
      if (host[0] != 0 || host.back() != q.shape[0])
        return Status::invalid("cu_seqlens: ring attention expects cu_seqlens[0] = 0 and cu_seqlens[batch] = total "
                               "rows (" + std::to_string(q.shape[0]) + ")");
      for (int b = 0; b < shape->batch; ++b) {
        const int len = host[b + 1] - host[b];
        if (len < 0 || len % shape->chunks != 0 || len > max_seqlen)
          return Status::invalid("cu_seqlens: sequence " + std::to_string(b) + " has " + std::to_string(len) +
                                 " local rows; expected 0.." + std::to_string(max_seqlen) + " in multiples of " +
                                 std::to_string(shape->chunks));
      }
    }
    shape->chunk_rows = q.shape[0] / shape->chunks;
  } else {
    if (q.rank != 4) return Status::invalid("q: ring attention expects [batch, seqlen_local, heads_q, head_dim]");
    if (k.rank != 4 || k.shape[1] != q.shape[1])
      return Status::invalid("k: ring attention is self-attention: expected seqlen_local " +
                             std::to_string(q.shape[1]));
    shape->rows = q.shape[1];
    if (shape->rows % shape->chunks != 0)
      return Status::invalid("q: seqlen_local " + std::to_string(shape->rows) + " must hold " +
                             std::to_string(shape->chunks) + " equal chunks");
    shape->chunk_rows = shape->rows / shape->chunks;
  }
  return {};
}

// The communication of one ring: neighbours, the stream, and the grouped
// send-to-next / receive-from-previous of one buffer.
struct Ring {
  ncclComm_t comm;
  cudaStream_t compute, comm_stream;
  int next, prev;

  Status exchange(const void* send, void* receive, std::size_t bytes) const {
    RING_TRY(nccl_status(ncclGroupStart(), "ncclGroupStart"));
    RING_TRY(nccl_status(ncclSend(send, bytes, ncclChar, next, comm, comm_stream), "ncclSend"));
    RING_TRY(nccl_status(ncclRecv(receive, bytes, ncclChar, prev, comm, comm_stream), "ncclRecv"));
    return nccl_status(ncclGroupEnd(), "ncclGroupEnd");
  }
  static Status wait(cudaStream_t stream, cudaEvent_t event) {
    return cuda_status(cudaStreamWaitEvent(stream, event, 0), "ring: cudaStreamWaitEvent");
  }
  static Status record(cudaEvent_t event, cudaStream_t stream) {
    return cuda_status(cudaEventRecord(event, stream), "ring: cudaEventRecord");
  }
};

// Rows of a chunk-major or dense buffer covered by chunks [first, first + count).
struct ChunkRows {
  const RingShape& shape;
  TensorView of(const TensorView& v, int first, int count) const {
    return rows(v, shape.row_dim, first * shape.chunk_rows, count * shape.chunk_rows);
  }
  TensorView of_lse(const TensorView& lse, int first, int count) const {
    return rows(lse, shape.lse_row_dim, first * shape.chunk_rows, count * shape.chunk_rows);
  }
};

AttentionOptions step_options(const AttentionOptions& options, const RingCall& call) {
  AttentionOptions o = options;
  o.causal = call.causal;
  o.window_left = call.window_left;
  o.window_right = call.window_right;
  o.diagonal_offset = call.diagonal_offset;
  o.check_index_contents = false;  // checked once for the whole ring
  return o;
}

Status step_calls(const RingShape& shape, RingLayout layout, int kv_rank, const AttentionOptions& options,
                  bool alibi, std::vector<RingCall>* calls) {
  RingMask mask{options.causal, options.window_left, options.window_right, alibi};
  return ring_step_calls(layout, shape.world, shape.rank, kv_rank, mask, shape.varlen,
                         shape.varlen ? 0 : shape.chunk_rows, calls);
}

// Varlen zigzag works in chunk-major order; the rest in the caller's.
bool permuted(const RingShape& shape) { return shape.varlen && shape.chunks > 1; }

// The rank's own K/V block into ring buffer `block` (k, then v; chunk-major
// for varlen zigzag, where `chunk_cu` receives cu_seqlens / chunks), and the
// varlen batch that one chunk of the shards is.
Status stage_own_block(const RingShape& shape, const TensorView& k, const TensorView& v, const TensorView& cu_seqlens,
                       void* block, std::int32_t* chunk_cu, cudaStream_t stream, VarlenBatch* chunk_batch) {
  const std::size_t k_bytes = bytes_of(k);
  if (permuted(shape)) {
    const auto* cu = static_cast<const std::int32_t*>(cu_seqlens.data);
    RING_TRY(detail::ring_permute_rows(contiguous_like(k, block, k.dtype), k, cu, shape.batch, shape.chunks, true,
                                       stream));
    RING_TRY(detail::ring_permute_rows(contiguous_like(v, static_cast<char*>(block) + k_bytes, v.dtype), v, cu,
                                       shape.batch, shape.chunks, true, stream));
    RING_TRY(detail::ring_chunk_cu_seqlens(chunk_cu, cu, shape.batch, shape.chunks, stream));
  } else {
    RING_TRY(cuda_status(cudaMemcpyAsync(block, k.data, k_bytes, cudaMemcpyDeviceToDevice, stream), "ring: k"));
    RING_TRY(cuda_status(cudaMemcpyAsync(static_cast<char*>(block) + k_bytes, v.data, bytes_of(v),
                                         cudaMemcpyDeviceToDevice, stream),
                         "ring: v"));
    chunk_cu = static_cast<std::int32_t*>(cu_seqlens.data);
  }
  if (shape.varlen) {
    TensorView cu = cu_seqlens;
    cu.data = chunk_cu;
    *chunk_batch = {cu, cu, shape.max_chunk, shape.max_chunk};
  }
  return {};
}

}  // namespace

bool ring_attention_available() { return true; }

Status ring_attention_forward(const RingForwardArgs& args, const AttentionOptions& options, RingLayout layout,
                              ncclComm_t comm, const RunContext& context) {
  RingShape shape;
  RING_TRY(check_shards(args.q, args.k, args.v, args.cu_seqlens, args.max_seqlen, options, layout, comm, &shape));
  if (args.out.empty()) return Status::invalid("out: required");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(context.stream);
  Ring ring{comm, stream, nullptr, (shape.rank + 1) % shape.world, (shape.rank + shape.world - 1) % shape.world};
  RING_TRY(comm_stream_of(args.q.device.index, &ring.comm_stream));
  Scratch scratch(context, stream);
  Events events;
  const ChunkRows chunk{shape};

  // Buffers: K/V twice (k then v, contiguous), the fp32 accumulators, one step's partial.
  const std::size_t k_bytes = bytes_of(args.k), kv_bytes = k_bytes + bytes_of(args.v);
  void* kv[2];
  for (void*& buffer : kv) RING_TRY(scratch.get(kv_bytes, &buffer));
  auto k_in = [&](void* buffer) { return contiguous_like(args.k, buffer, args.k.dtype); };
  auto v_in = [&](void* buffer) { return contiguous_like(args.v, static_cast<char*>(buffer) + k_bytes, args.v.dtype); };
  TensorView lse_like = args.lse;
  if (lse_like.empty()) {  // the shape the library would give it
    lse_like = args.q;
    if (shape.varlen) lse_like.rank = 2, lse_like.shape[0] = args.q.shape[1], lse_like.shape[1] = args.q.shape[0];
    else lse_like.rank = 3, lse_like.shape[0] = args.q.shape[0], lse_like.shape[1] = args.q.shape[2], lse_like.shape[2] = args.q.shape[1];
  }
  void *acc_out_data, *acc_lse_data, *part_out_data, *part_lse_data;
  RING_TRY(scratch.get(args.q.numel() * sizeof(float), &acc_out_data));
  RING_TRY(scratch.get(lse_like.numel() * sizeof(float), &acc_lse_data));
  RING_TRY(scratch.get(bytes_of(args.q), &part_out_data));
  RING_TRY(scratch.get(lse_like.numel() * sizeof(float), &part_lse_data));
  const TensorView acc_out = contiguous_like(args.q, acc_out_data, DType::f32);
  const TensorView acc_lse = contiguous_like(lse_like, acc_lse_data, DType::f32);
  const TensorView part_out = contiguous_like(args.q, part_out_data, args.q.dtype);
  const TensorView part_lse = contiguous_like(lse_like, part_lse_data, DType::f32);
  RING_TRY(cuda_status(cudaMemsetAsync(acc_out_data, 0, args.q.numel() * sizeof(float), stream), "ring: memset"));
  RING_TRY(detail::ring_fill(acc_lse, -INFINITY, stream));

  // The local queries and K/V block, chunk-major for varlen zigzag.
  TensorView q = args.q;
  std::int32_t* chunk_cu = nullptr;
  if (permuted(shape)) {
    void *q_data, *cu_data;
    RING_TRY(scratch.get(bytes_of(args.q), &q_data));
    RING_TRY(scratch.get((shape.batch + 1) * sizeof(std::int32_t), &cu_data));
    chunk_cu = static_cast<std::int32_t*>(cu_data);
    q = contiguous_like(args.q, q_data, args.q.dtype);
    RING_TRY(detail::ring_permute_rows(q, args.q, static_cast<const std::int32_t*>(args.cu_seqlens.data), shape.batch,
                                       shape.chunks, true, stream));
  }
  VarlenBatch chunk_batch;
  RING_TRY(stage_own_block(shape, args.k, args.v, args.cu_seqlens, kv[0], chunk_cu, stream, &chunk_batch));

  cudaEvent_t block_ready, received[2], used[2];
  RING_TRY(events.make(&block_ready));
  for (int i = 0; i < 2; ++i) {
    RING_TRY(events.make(&received[i]));
    RING_TRY(events.make(&used[i]));
  }
  RING_TRY(Ring::record(block_ready, stream));

  const RunContext inner{stream, nullptr, 0, context.allocator};
  std::vector<RingCall> calls;
  for (int step = 0; step < shape.world; ++step) {
    const int cur = step % 2, nxt = 1 - cur;
    if (step + 1 < shape.world) {  // the next block travels while this one is used
      if (step == 0) RING_TRY(Ring::wait(ring.comm_stream, block_ready));
      if (step >= 1) RING_TRY(Ring::wait(ring.comm_stream, used[nxt]));
      RING_TRY(ring.exchange(kv[cur], kv[nxt], kv_bytes));
      RING_TRY(Ring::record(received[nxt], ring.comm_stream));
    }
    if (step > 0) RING_TRY(Ring::wait(stream, received[cur]));
    const int kv_rank = (shape.rank - step + shape.world) % shape.world;
    RING_TRY(step_calls(shape, layout, kv_rank, options, !args.alibi_slopes.empty(), &calls));
    for (const RingCall& call : calls) {
      ForwardArgs f;
      f.q = chunk.of(q, call.q_first, call.q_count);
      f.k = chunk.of(k_in(kv[cur]), call.k_first, call.k_count);
      f.v = chunk.of(v_in(kv[cur]), call.k_first, call.k_count);
      f.out = chunk.of(part_out, 0, call.q_count);
      f.lse = chunk.of_lse(part_lse, 0, call.q_count);
      f.alibi_slopes = args.alibi_slopes;
      f.varlen = chunk_batch;
      RING_TRY(attention_forward(f, step_options(options, call), inner));
      TensorView acc_rows = chunk.of(acc_out, call.q_first, call.q_count);
      TensorView acc_lse_rows = chunk.of_lse(acc_lse, call.q_first, call.q_count);
      TensorView part_rows = f.out, part_lse_rows = f.lse;
      if (shape.varlen) {
        acc_rows = as_batch_of_one(acc_rows), acc_lse_rows = as_batch_of_one(acc_lse_rows);
        part_rows = as_batch_of_one(part_rows), part_lse_rows = as_batch_of_one(part_lse_rows);
      }
      RING_TRY(merge_states({acc_rows, acc_lse_rows, part_rows, part_lse_rows, acc_rows, acc_lse_rows}, Backend::cuda,
                            inner));
    }
    RING_TRY(Ring::record(used[cur], stream));
  }

  if (permuted(shape)) {
    const auto* cu = static_cast<const std::int32_t*>(args.cu_seqlens.data);
    // Back to the caller's order: fp32 rows permuted, then converted.
    void* ordered_data;
    RING_TRY(scratch.get(args.q.numel() * sizeof(float), &ordered_data));
    const TensorView ordered = contiguous_like(args.q, ordered_data, DType::f32);
    RING_TRY(detail::ring_permute_rows(ordered, acc_out, cu, shape.batch, shape.chunks, false, stream));
    RING_TRY(detail::ring_convert(args.out, ordered, stream));
    if (!args.lse.empty())
      RING_TRY(detail::ring_permute_rows(lse_as_rows(args.lse), lse_as_rows(acc_lse), cu, shape.batch, shape.chunks,
                                         false, stream));
  } else {
    RING_TRY(detail::ring_convert(args.out, acc_out, stream));
    if (!args.lse.empty())  // (ring_convert takes rank 3 or 4: varlen's [H, T] as [1, H, T])
      RING_TRY(detail::ring_convert(shape.varlen ? as_batch_of_one(args.lse) : args.lse,
                                    shape.varlen ? as_batch_of_one(acc_lse) : acc_lse, stream));
  }
  return {};
}

Status ring_attention_backward(const RingBackwardArgs& args, const AttentionOptions& options, RingLayout layout,
                               ncclComm_t comm, const RunContext& context) {
  RingShape shape;
  RING_TRY(check_shards(args.q, args.k, args.v, args.cu_seqlens, args.max_seqlen, options, layout, comm, &shape));
  for (const auto& [name, view] : {std::pair{"out", args.out}, std::pair{"dout", args.dout}, std::pair{"lse", args.lse},
                                   std::pair{"dq", args.dq}, std::pair{"dk", args.dk}, std::pair{"dv", args.dv}})
    if (view.empty()) return Status::invalid(std::string(name) + ": required");
  DeviceGuard guard(args.q.device.index);
  const auto stream = static_cast<cudaStream_t>(context.stream);
  Ring ring{comm, stream, nullptr, (shape.rank + 1) % shape.world, (shape.rank + shape.world - 1) % shape.world};
  RING_TRY(comm_stream_of(args.q.device.index, &ring.comm_stream));
  Scratch scratch(context, stream);
  Events events;
  const ChunkRows chunk{shape};

  const std::size_t k_bytes = bytes_of(args.k), kv_bytes = k_bytes + bytes_of(args.v);
  const std::size_t dk_floats = args.k.numel(), dkv_bytes = (dk_floats + args.v.numel()) * sizeof(float);
  void *kv[2], *dkv[2];
  for (int i = 0; i < 2; ++i) {
    RING_TRY(scratch.get(kv_bytes, &kv[i]));
    RING_TRY(scratch.get(dkv_bytes, &dkv[i]));
  }
  auto k_in = [&](void* buffer) { return contiguous_like(args.k, buffer, args.k.dtype); };
  auto v_in = [&](void* buffer) { return contiguous_like(args.v, static_cast<char*>(buffer) + k_bytes, args.v.dtype); };
  auto dk_in = [&](void* buffer) { return contiguous_like(args.k, buffer, DType::f32); };
  auto dv_in = [&](void* buffer) {
    return contiguous_like(args.v, static_cast<float*>(buffer) + dk_floats, DType::f32);
  };
  void *dq_acc_data, *part_dq_data, *part_dk_data, *part_dv_data;
  RING_TRY(scratch.get(args.q.numel() * sizeof(float), &dq_acc_data));
  RING_TRY(scratch.get(bytes_of(args.q), &part_dq_data));
  RING_TRY(scratch.get(bytes_of(args.k), &part_dk_data));
  RING_TRY(scratch.get(bytes_of(args.v), &part_dv_data));
  const TensorView dq_acc = contiguous_like(args.q, dq_acc_data, DType::f32);
  const TensorView part_dq = contiguous_like(args.q, part_dq_data, args.q.dtype);
  const TensorView part_dk = contiguous_like(args.k, part_dk_data, args.k.dtype);
  const TensorView part_dv = contiguous_like(args.v, part_dv_data, args.v.dtype);
  RING_TRY(cuda_status(cudaMemsetAsync(dq_acc_data, 0, args.q.numel() * sizeof(float), stream), "ring: memset"));
  RING_TRY(cuda_status(cudaMemsetAsync(dkv[0], 0, dkv_bytes, stream), "ring: memset"));

  TensorView q = args.q, out = args.out, dout = args.dout, lse = args.lse;
  std::int32_t* chunk_cu = nullptr;
  const auto* cu = static_cast<const std::int32_t*>(args.cu_seqlens.data);
  if (permuted(shape)) {
    void *q_data, *out_data, *dout_data, *lse_data, *cu_data;
    RING_TRY(scratch.get(bytes_of(args.q), &q_data));
    RING_TRY(scratch.get(bytes_of(args.out), &out_data));
    RING_TRY(scratch.get(bytes_of(args.dout), &dout_data));
    RING_TRY(scratch.get(args.lse.numel() * sizeof(float), &lse_data));
    RING_TRY(scratch.get((shape.batch + 1) * sizeof(std::int32_t), &cu_data));
    chunk_cu = static_cast<std::int32_t*>(cu_data);
    q = contiguous_like(args.q, q_data, args.q.dtype);
    out = contiguous_like(args.out, out_data, args.out.dtype);
    dout = contiguous_like(args.dout, dout_data, args.dout.dtype);
    lse = contiguous_like(args.lse, lse_data, DType::f32);
    RING_TRY(detail::ring_permute_rows(q, args.q, cu, shape.batch, shape.chunks, true, stream));
    RING_TRY(detail::ring_permute_rows(out, args.out, cu, shape.batch, shape.chunks, true, stream));
    RING_TRY(detail::ring_permute_rows(dout, args.dout, cu, shape.batch, shape.chunks, true, stream));
    RING_TRY(detail::ring_permute_rows(lse_as_rows(lse), lse_as_rows(args.lse), cu, shape.batch, shape.chunks, true,
                                       stream));
  }
  VarlenBatch chunk_batch;
  RING_TRY(stage_own_block(shape, args.k, args.v, args.cu_seqlens, kv[0], chunk_cu, stream, &chunk_batch));

  cudaEvent_t block_ready, kv_received[2], kv_used[2], grads_received[2], grads_added;
  RING_TRY(events.make(&block_ready));
  RING_TRY(events.make(&grads_added));
  for (int i = 0; i < 2; ++i) {
    RING_TRY(events.make(&kv_received[i]));
    RING_TRY(events.make(&kv_used[i]));
    RING_TRY(events.make(&grads_received[i]));
  }
  RING_TRY(Ring::record(block_ready, stream));

  const RunContext inner{stream, nullptr, 0, context.allocator};
  std::vector<RingCall> calls;
  for (int step = 0; step < shape.world; ++step) {
    const int cur = step % 2, nxt = 1 - cur;
    if (step + 1 < shape.world) {
      if (step == 0) RING_TRY(Ring::wait(ring.comm_stream, block_ready));
      if (step >= 1) RING_TRY(Ring::wait(ring.comm_stream, kv_used[nxt]));
      RING_TRY(ring.exchange(kv[cur], kv[nxt], kv_bytes));
      RING_TRY(Ring::record(kv_received[nxt], ring.comm_stream));
    }
    if (step > 0) RING_TRY(Ring::wait(stream, kv_received[cur]));
    const int kv_rank = (shape.rank - step + shape.world) % shape.world;
    RING_TRY(step_calls(shape, layout, kv_rank, options, !args.alibi_slopes.empty(), &calls));
    bool grads_here = step == 0;  // this block's dK/dV accumulators: zero at home, else in flight
    for (const RingCall& call : calls) {
      BackwardArgs g;
      g.q = chunk.of(q, call.q_first, call.q_count);
      g.k = chunk.of(k_in(kv[cur]), call.k_first, call.k_count);
      g.v = chunk.of(v_in(kv[cur]), call.k_first, call.k_count);
      g.out = chunk.of(out, call.q_first, call.q_count);
      g.dout = chunk.of(dout, call.q_first, call.q_count);
      g.lse = chunk.of_lse(lse, call.q_first, call.q_count);
      g.dq = chunk.of(part_dq, 0, call.q_count);
      g.dk = chunk.of(part_dk, 0, call.k_count);
      g.dv = chunk.of(part_dv, 0, call.k_count);
      g.alibi_slopes = args.alibi_slopes;
      g.varlen = chunk_batch;
      RING_TRY(attention_backward(g, step_options(options, call), inner));
      RING_TRY(detail::ring_accumulate(chunk.of(dq_acc, call.q_first, call.q_count), g.dq, stream));
      if (!grads_here) {  // the kernels above ran while the accumulators travelled
        RING_TRY(Ring::wait(stream, grads_received[cur]));
        grads_here = true;
      }
      RING_TRY(detail::ring_accumulate(chunk.of(dk_in(dkv[cur]), call.k_first, call.k_count), g.dk, stream));
      RING_TRY(detail::ring_accumulate(chunk.of(dv_in(dkv[cur]), call.k_first, call.k_count), g.dv, stream));
    }
    if (!grads_here) RING_TRY(Ring::wait(stream, grads_received[cur]));  // a step without calls
    RING_TRY(Ring::record(kv_used[cur], stream));
    if (shape.world > 1) {  // the accumulators move on with their block; after W steps they are home
      RING_TRY(Ring::record(grads_added, stream));
      RING_TRY(Ring::wait(ring.comm_stream, grads_added));
      RING_TRY(ring.exchange(dkv[cur], dkv[nxt], dkv_bytes));
      RING_TRY(Ring::record(grads_received[nxt], ring.comm_stream));
    }
  }
  const int home = shape.world == 1 ? 0 : shape.world % 2;  // where this rank's own block's accumulators are
  if (shape.world > 1) RING_TRY(Ring::wait(stream, grads_received[home]));

  if (permuted(shape)) {
    void* ordered_data;
    RING_TRY(scratch.get(std::max(args.q.numel(), args.k.numel()) * sizeof(float), &ordered_data));
    const auto put = [&](const TensorView& dst, const TensorView& acc) -> Status {
      const TensorView ordered = contiguous_like(acc, ordered_data, DType::f32);
      RING_TRY(detail::ring_permute_rows(ordered, acc, cu, shape.batch, shape.chunks, false, stream));
      return detail::ring_convert(dst, ordered, stream);
    };
    RING_TRY(put(args.dq, dq_acc));
    RING_TRY(put(args.dk, dk_in(dkv[home])));
    RING_TRY(put(args.dv, dv_in(dkv[home])));
  } else {
    RING_TRY(detail::ring_convert(args.dq, dq_acc, stream));
    RING_TRY(detail::ring_convert(args.dk, dk_in(dkv[home]), stream));
    RING_TRY(detail::ring_convert(args.dv, dv_in(dkv[home]), stream));
  }
  return {};
}

#endif  // CUFLASH_WITH_NCCL

}  // namespace cuflash
