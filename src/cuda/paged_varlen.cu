#include "common/paged_varlen.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/attention_params.hpp"
#include "common/cuda_check.hpp"
#include "common/kv_cache.cuh"
#include "common/scratch.hpp"

namespace cuflash::detail {

namespace {

// The packed buffers: [rows, Hk, D] with each head's row padded to a
// multiple of 16 bytes, so that the tensor-core kernels' 16-byte row rule
// holds whatever head_dim is, and the copy writes whole 16-byte chunks where
// the cache allows it.
struct PackedLayout {
  std::int64_t rows = 0;
  std::int64_t head_stride = 0;  // elements
  std::int64_t row_stride = 0;   // elements
  std::size_t tensor_bytes = 0;  // of K (and of V), a multiple of 256
};

PackedLayout packed_layout(const Problem& p) {
  PackedLayout layout;
  // Without the host's cu_seqlens_k, the bound every valid one keeps (each
  // length <= max_seqlen_k): the varlen kernels then read inside the buffers
  // whatever the block table holds.
  layout.rows = p.host_indices_valid ? p.host_cu_seqlens_k[p.batch]
                                     : static_cast<std::int64_t>(p.batch) * p.max_kv_len;
  // A batch with no key at all still gets one row: the kernels map K and V
  // for TMA, which takes no empty dimension. No sequence owns it.
  layout.rows = std::max<std::int64_t>(layout.rows, 1);
  const std::int64_t element = static_cast<std::int64_t>(dtype_size(p.dtype));
  layout.head_stride = (p.head_dim * element + 15) / 16 * 16 / element;
  layout.row_stride = layout.head_stride * p.heads_kv;
  layout.tensor_bytes = align256(static_cast<std::size_t>(layout.rows * layout.row_stride * element));
  return layout;
}

TensorView packed_view(const TensorView& cache, void* data, const PackedLayout& layout) {
  TensorView view;
  view.data = data;
  view.dtype = cache.dtype;
  view.device = cache.device;
  view.rank = 3;
  view.shape[0] = layout.rows;
  view.shape[1] = cache.shape[2];
  view.shape[2] = cache.shape[3];
  view.strides[0] = layout.row_stride;
  view.strides[1] = layout.head_stride;
  view.strides[2] = 1;
  return view;
}

// Where the packed buffers would start, for choices made before a workspace
// exists: aligned as every workspace region is (align256), never dereferenced.
void* stand_in_workspace() { return reinterpret_cast<void*>(std::uintptr_t{256}); }

struct GatherParams {
  const char* k_cache = nullptr;
  const char* v_cache = nullptr;
  RowStrides k_strides, v_strides;  // elements: page, slot, head
  KvCacheParams pages;              // block table, page shift, pages in the cache, keys per row
  const std::int32_t* cu_seqlens_k = nullptr;
  int batch = 0, heads_kv = 0, chunks_per_head = 0, element_bytes = 0;
  char* k_packed = nullptr;
  char* v_packed = nullptr;
  std::int64_t packed_rows = 0, packed_row_stride = 0, packed_head_stride = 0;  // strides in elements
};

// The sequence whose key packed row `row` holds: b with cu[b] <= row <
// cu[b + 1], or -1 for a row of no sequence. The search keeps cu[lo] <= row <
// cu[hi], so even an unchecked, non-monotone cu_seqlens_k gives a b whose
// key index row - cu[b] is in [0, cu[b + 1] - cu[b]).
__device__ __forceinline__ int sequence_of_row(const std::int32_t* cu, int batch, std::int64_t row) {
  if (row < __ldg(cu) || row >= __ldg(cu + batch)) return -1;
  int lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (__ldg(cu + mid) <= row) lo = mid;
    else hi = mid;
  }
  return lo;
}

// One thread per Chunk of a (packed row, kv head), K and V together; the
// threads of a row search cu_seqlens_k for its sequence (a few cached
// loads). Grid-stride, so a long prefill does not launch millions of blocks.
template <typename Chunk>
__global__ void gather_paged_keys_kernel(const GatherParams g) {
  const std::int64_t per_row = static_cast<std::int64_t>(g.heads_kv) * g.chunks_per_head;
  const std::int64_t total = g.packed_rows * per_row;
  for (std::int64_t idx = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = idx / per_row;
    const int in_row = static_cast<int>(idx % per_row);
    const int hk = in_row / g.chunks_per_head;
    const int chunk = in_row % g.chunks_per_head;
    const int b = sequence_of_row(g.cu_seqlens_k, g.batch, row);
    if (b < 0) continue;  // no sequence reads this row
    const std::int64_t key = row - __ldg(g.cu_seqlens_k + b);
    const std::int64_t packed = row * g.packed_row_stride + hk * g.packed_head_stride;
    Chunk* k_dst = reinterpret_cast<Chunk*>(g.k_packed + packed * g.element_bytes) + chunk;
    Chunk* v_dst = reinterpret_cast<Chunk*>(g.v_packed + packed * g.element_bytes) + chunk;
    // Past the block-table row, or a page outside the cache: only with
    // check_index_contents off (validation refuses both); zeros keep the
    // result defined and every access inside the tensors.
    const int page = key < g.pages.capacity ? cache_page(g.pages, b, static_cast<int>(key)) : -1;
    if (page < 0) {
      *k_dst = Chunk{};
      *v_dst = Chunk{};
      continue;
    }
    const int slot = cache_slot(g.pages, static_cast<int>(key));
    const char* k_src = g.k_cache + cache_offset(g.k_strides, page, slot, hk) * g.element_bytes;
    const char* v_src = g.v_cache + cache_offset(g.v_strides, page, slot, hk) * g.element_bytes;
    *k_dst = reinterpret_cast<const Chunk*>(k_src)[chunk];
    *v_dst = reinterpret_cast<const Chunk*>(v_src)[chunk];
  }
}

// The widest copy unit (16, 8, 4 or 2 bytes) that every source row's start
// and length are multiples of; the packed side is 16-byte aligned.
int chunk_bytes(const Problem& p) {
  const std::uint64_t element = dtype_size(p.dtype);
  std::uint64_t bits = 16 | (static_cast<std::uint64_t>(p.head_dim) * element);
  for (const TensorView* cache : {&p.k, &p.v}) {
    bits |= reinterpret_cast<std::uintptr_t>(cache->data);
    for (int dim = 0; dim < 3; ++dim) bits |= static_cast<std::uint64_t>(cache->strides[dim]) * element;
  }
  return static_cast<int>(bits & (~bits + 1));  // the lowest set bit
}

template <typename Chunk>
Status launch_gather(const GatherParams& g, cudaStream_t stream) {
  const std::int64_t total = g.packed_rows * g.heads_kv * g.chunks_per_head;
  constexpr int kThreads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((total + kThreads - 1) / kThreads, 8192);
  gather_paged_keys_kernel<Chunk><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(g);
  return launch_status("gather_paged_keys_kernel");
}

}  // namespace

Status paged_varlen_supports(const Problem& problem) {
  if (!cuda_page_size_supported(problem.page_size))
    return Status::unsupported("backend cuda forward (varlen with kv_cache.block_table): page_size " +
                               std::to_string(problem.page_size) + " is not " + kCudaPageSizeRule +
                               " (as for KV caches; backend cpu takes any page size)");
  return {};
}

std::size_t packed_keys_bytes(const Problem& problem) { return 2 * packed_layout(problem).tensor_bytes; }

Problem packed_keys_problem(const Problem& problem, void* workspace) {
  const PackedLayout layout = packed_layout(problem);
  char* base = static_cast<char*>(workspace != nullptr ? workspace : stand_in_workspace());
  Problem packed = problem;
  packed.paged = false;
  packed.page_size = packed.num_pages = packed.max_pages = packed.cache_capacity = 0;
  packed.block_table = {};
  packed.host_block_table.clear();
  packed.k = packed_view(problem.k, base, layout);
  packed.v = packed_view(problem.v, base + layout.tensor_bytes, layout);
  return packed;
}

Status gather_paged_keys(const Problem& problem, const Problem& packed, cudaStream_t stream) {
  if (reinterpret_cast<std::uintptr_t>(packed.k.data) % 16 != 0)
    return Status::invalid("workspace: must start on a 16-byte boundary (cudaMalloc gives 256) for a varlen call "
                           "with kv_cache.block_table, whose keys are packed into it");
  const int chunk = chunk_bytes(problem);
  GatherParams g;
  g.k_cache = static_cast<const char*>(problem.k.data);
  g.v_cache = static_cast<const char*>(problem.v.data);
  g.k_strides = row_strides(problem.k, Layout::kv_cache);
  g.v_strides = row_strides(problem.v, Layout::kv_cache);
  g.pages = make_kv_cache_params(problem);
  g.cu_seqlens_k = static_cast<const std::int32_t*>(problem.cu_seqlens_k.data);
  g.batch = problem.batch;
  g.heads_kv = problem.heads_kv;
  g.element_bytes = static_cast<int>(dtype_size(problem.dtype));
  g.chunks_per_head = problem.head_dim * g.element_bytes / chunk;
  g.k_packed = static_cast<char*>(packed.k.data);
  g.v_packed = static_cast<char*>(packed.v.data);
  g.packed_rows = packed.k.shape[0];
  g.packed_row_stride = packed.k.strides[0];
  g.packed_head_stride = packed.k.strides[1];
  switch (chunk) {
    case 16: return launch_gather<uint4>(g, stream);
    case 8: return launch_gather<uint2>(g, stream);
    case 4: return launch_gather<std::uint32_t>(g, stream);
    default: return launch_gather<std::uint16_t>(g, stream);
  }
}

}  // namespace cuflash::detail
