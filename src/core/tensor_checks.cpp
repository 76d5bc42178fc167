#include "tensor_checks.hpp"

#include <tuple>

#include "byte_dims.hpp"
#include "index_copy.hpp"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <sstream>
#include <vector>

namespace cuflash::detail {

namespace {

std::string join(const std::int64_t* values, int count) {
  std::ostringstream text;
  text << '[';
  for (int d = 0; d < count; ++d) text << (d ? ", " : "") << values[d];
  text << ']';
  return text.str();
}

// Each stride exceeds the largest offset reachable through smaller strides,
// so every address has at most one index (and offsets decompose digit by digit).
bool nests(const std::vector<ByteDim>& dims) {
  std::int64_t inner_span = 0;
  for (auto dim = dims.rbegin(); dim != dims.rend(); ++dim) {
    if (dim->stride <= inner_span) return false;
    inner_span += (dim->extent - 1) * dim->stride;
  }
  return true;
}

std::int64_t span_bytes(const std::vector<ByteDim>& dims) {
  std::int64_t span = 0;
  for (const auto& dim : dims) span += (dim.extent - 1) * dim.stride;
  return span + 1;
}

// Is there an index difference (each digit in (-extent, extent)) whose offset
// is `delta`? With nesting strides only the two digits nearest delta/stride
// can leave a remainder the inner dimensions reach.
bool offset_reachable(std::int64_t delta, const std::vector<ByteDim>& dims, std::size_t first) {
  if (first == dims.size()) return delta == 0;
  std::int64_t inner_span = 0;
  for (std::size_t d = first + 1; d < dims.size(); ++d) inner_span += (dims[d].extent - 1) * dims[d].stride;
  const ByteDim& dim = dims[first];
  const std::int64_t floor_digit = delta >= 0 ? delta / dim.stride : -((-delta + dim.stride - 1) / dim.stride);
  for (std::int64_t digit = floor_digit; digit <= floor_digit + 1; ++digit) {
    if (digit <= -dim.extent || digit >= dim.extent) continue;
    const std::int64_t rest = delta - digit * dim.stride;
    if (std::llabs(rest) <= inner_span && offset_reachable(rest, dims, first + 1)) return true;
  }
  return false;
}

}  // namespace

std::vector<ByteDim> byte_dims(const TensorView& view) {
  const auto element_bytes = static_cast<std::int64_t>(dtype_size(view.dtype));
  std::vector<ByteDim> dims;
  for (int d = 0; d < view.rank; ++d)
    if (view.shape[d] > 1) dims.push_back({view.shape[d], view.strides[d] * element_bytes});
  if (element_bytes > 1) dims.push_back({element_bytes, 1});
  std::sort(dims.begin(), dims.end(), [](const ByteDim& x, const ByteDim& y) { return x.stride > y.stride; });
  return dims;
}

std::string shape_string(const TensorView& view) { return join(view.shape, view.rank); }
std::string stride_string(const TensorView& view) { return join(view.strides, view.rank); }

std::string device_string(Device device) {
  if (device.kind == DeviceKind::host) return "host";
  return "cuda:" + std::to_string(device.index);
}

Status check_given(const TensorView& view, const char* name) {
  if (view.empty()) return Status::invalid(std::string(name) + ": required but not given (rank 0)");
  return {};
}

Status check_layout(const TensorView& view, const char* name, int rank, const char* dims_doc,
                    bool last_dim_contiguous) {
  const std::string arg(name);
  if (view.rank != rank) {
    std::string message = arg + ": expected rank " + std::to_string(rank) + " " + dims_doc + ", got rank " +
                          std::to_string(view.rank);
    if (view.rank > 0 && view.rank <= kMaxRank) message.append(" ").append(shape_string(view));
    return Status::invalid(message);
  }
  // Extents are held as int in Problem (and in kernel parameters).
  for (int d = 0; d < rank; ++d)
    if (view.shape[d] < 0 || view.shape[d] > std::numeric_limits<std::int32_t>::max())
      return Status::invalid(arg + ": every dimension must be in [0, 2^31), got shape " + shape_string(view));
  if (view.data == nullptr && view.numel() > 0) return Status::invalid(arg + ": data pointer is null");
  for (int d = 0; d < rank; ++d)
    if (view.strides[d] < 0)
      return Status::invalid(arg + ": strides must be non-negative, got strides " + stride_string(view));
  // An empty tensor's strides address nothing (numpy's DLPack export gives them as 0).
  if (last_dim_contiguous && view.shape[rank - 1] > 1 && view.strides[rank - 1] != 1 && view.numel() > 0)
    return Status::invalid(arg + ": last dimension must be contiguous (stride 1), got stride " +
                           std::to_string(view.strides[rank - 1]));
  const auto element_bytes = dtype_size(view.dtype);
  if (element_bytes > 1 && reinterpret_cast<std::uintptr_t>(view.data) % element_bytes != 0)
    return Status::invalid(arg + ": data pointer is not aligned to its " + std::to_string(element_bytes) +
                           "-byte elements");
  return {};
}

Status check_dtype(const TensorView& view, const char* name, DType expected, const char* why) {
  if (view.dtype == expected) return {};
  return Status::invalid(std::string(name) + ": expected dtype " + dtype_name(expected) + " (" + why + "), got " +
                         dtype_name(view.dtype));
}

Status check_device(const TensorView& view, const char* name, Device expected) {
  if (view.device == expected) return {};
  return Status::invalid(std::string(name) + ": expected device " + device_string(expected) +
                         " (same as q), got " + device_string(view.device));
}

Status check_dims(const TensorView& view, const char* name, std::initializer_list<DimSpec> dims,
                  const char* like) {
  int d = 0;
  for (const DimSpec& dim : dims) {
    if (dim.extent >= 0 && view.shape[d] != dim.extent)
      return Status::invalid(std::string(name) + ": dim " + std::to_string(d) + " (" + dim.name + ") expected " +
                             std::to_string(dim.extent) + " (" + like + "), got " + std::to_string(view.shape[d]) +
                             " in shape " + shape_string(view));
    ++d;
  }
  return {};
}

Status check_head_dim(const TensorView& view, const char* name, const char* dims_doc) {
  if (view.shape[view.rank - 1] >= 1) return {};
  return Status::invalid(std::string(name) + ": head_dim (the last dimension of " + dims_doc +
                         ") must be >= 1 (flash-attn refuses 0 as well), got shape " + shape_string(view));
}

Status check_no_self_overlap(const TensorView& view, const char* name) {
  if (view.numel() == 0 || nests(byte_dims(view))) return {};
  return Status::invalid(std::string(name) + ": output elements overlap in memory (shape " + shape_string(view) +
                         ", strides " + stride_string(view) + ")");
}

Status check_like(const TensorView& view, const char* name, const TensorView& like, const char* like_name,
                  const char* dims_doc) {
  const std::string like_text = std::string("like ") + like_name;
  CUFLASH_TRY(check_given(view, name));
  CUFLASH_TRY(check_layout(view, name, like.rank, dims_doc, true));
  CUFLASH_TRY(check_dtype(view, name, like.dtype, like_text.c_str()));
  CUFLASH_TRY(check_device(view, name, like.device));
  for (int d = 0; d < like.rank; ++d)
    if (view.shape[d] != like.shape[d])
      return Status::invalid(std::string(name) + ": expected shape " + shape_string(like) + " (" + like_text + "), got " +
                             shape_string(view));
  return {};
}

Status check_no_aliasing(const std::vector<NamedView>& outputs, const std::vector<NamedView>& inputs) {
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    for (const NamedView& input : inputs)
      if (views_overlap(outputs[o].view, input.view))
        return Status::invalid(std::string(outputs[o].name) + ": overlaps " + input.name +
                               " in memory; an output may not alias an input");
    for (std::size_t other = o + 1; other < outputs.size(); ++other)
      if (views_overlap(outputs[o].view, outputs[other].view))
        return Status::invalid(std::string(outputs[o].name) + ": overlaps " + outputs[other].name +
                               " in memory; outputs may not alias each other");
  }
  return {};
}

bool same_view(const TensorView& a, const TensorView& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank || !(a.device == b.device)) return false;
  for (int d = 0; d < a.rank; ++d)
    if (a.shape[d] != b.shape[d] || (a.shape[d] > 1 && a.strides[d] != b.strides[d])) return false;
  return true;
}

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (a.empty() || b.empty() || a.numel() == 0 || b.numel() == 0) return false;
  if (!(a.device == b.device)) return false;
  const auto dims_a = byte_dims(a);
  const auto dims_b = byte_dims(b);
  const auto begin_a = reinterpret_cast<std::intptr_t>(a.data);
  const auto begin_b = reinterpret_cast<std::intptr_t>(b.data);
  const std::int64_t end_a = begin_a + span_bytes(dims_a);
  const std::int64_t end_b = begin_b + span_bytes(dims_b);
  if (end_a <= begin_b || end_b <= begin_a) return false;

  bool same_strides = dims_a.size() == dims_b.size();
  for (std::size_t d = 0; same_strides && d < dims_a.size(); ++d) same_strides = dims_a[d].stride == dims_b[d].stride;
  if (!same_strides || !nests(dims_a) || !nests(dims_b)) return true;
  // Address x of a equals address y of b iff begin_b - begin_a = index_a - index_b in
  // byte offsets; digits range over (-extent_b, extent_a). Use the union of extents,
  // a superset, which keeps the test conservative when extents differ.
  std::vector<ByteDim> dims = dims_a;
  for (std::size_t d = 0; d < dims.size(); ++d) dims[d].extent = std::max(dims_a[d].extent, dims_b[d].extent);
  if (!nests(dims)) return true;
  return offset_reachable(begin_b - begin_a, dims, 0);
}

Status check_query_key_value(const TensorView& q, const TensorView& k, const TensorView& v, int q_rank, int kv_rank,
                             const QkvDocs& docs, const char* dim_name) {
  const auto str = [](std::int64_t value) { return std::to_string(value); };
  CUFLASH_TRY(check_given(q, "q"));
  CUFLASH_TRY(check_layout(q, "q", q_rank, docs.q, true));
  if (q.dtype != DType::f32 && q.dtype != DType::f16 && q.dtype != DType::bf16)
    return Status::invalid(std::string("q: expected dtype f32, f16 or bf16, got ") + dtype_name(q.dtype));
  if (q.device.kind == DeviceKind::cuda && !built_with_cuda())
    return Status::unsupported("q: is in CUDA memory, but this build of cuflash has no CUDA support");
  CUFLASH_TRY(check_head_dim(q, "q", docs.q));
  for (const auto& [name, view, doc] : {std::tuple{"k", k, docs.k}, std::tuple{"v", v, docs.v}}) {
    CUFLASH_TRY(check_given(view, name));
    CUFLASH_TRY(check_layout(view, name, kv_rank, doc, true));
    CUFLASH_TRY(check_dtype(view, name, q.dtype, "same as q"));
    CUFLASH_TRY(check_device(view, name, q.device));
  }
  const std::int64_t head_dim = q.shape[q_rank - 1], heads_q = q.shape[q_rank - 2];
  const std::int64_t key_dim = k.shape[kv_rank - 1], heads_kv = k.shape[kv_rank - 2];
  if (key_dim != head_dim)
    return Status::invalid("k: " + std::string(dim_name) + " (last dim) expected " + str(head_dim) + " (like q), got " +
                           str(key_dim));
  // heads_kv = 0 divides only heads_q = 0 (no heads at all: an empty result).
  const bool heads_divide = heads_kv == 0 ? heads_q == 0 : heads_q % heads_kv == 0;
  if (!heads_divide)
    return Status::invalid("k: heads_kv (dim " + str(kv_rank - 2) + ") must divide heads_q = " + str(heads_q) +
                           " (GQA/MQA), got " + str(heads_kv));
  return {};
}

}  // namespace cuflash::detail
