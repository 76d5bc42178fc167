// Checks of one tensor view, each returning a Status whose message names the
// argument, what was expected and what was given.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "cuflash/status.hpp"
#include "cuflash/tensor.hpp"

namespace cuflash::detail {

std::string shape_string(const TensorView& view);   // "[2, 128, 8, 64]"
std::string stride_string(const TensorView& view);  // "[65536, 512, 64, 1]"
std::string device_string(Device device);           // "host", "cuda:0"

// A dimension's expected extent, for messages: {"heads_kv", 8}; extent -1
// leaves that dimension unchecked.
struct DimSpec {
  const char* name;
  std::int64_t extent;
};

Status check_given(const TensorView& view, const char* name);
// Rank, then non-null data, non-negative strides and (when asked) a
// contiguous last dimension. `dims_doc` names the dimensions: "[batch, seqlen_q, heads_q, head_dim]".
Status check_layout(const TensorView& view, const char* name, int rank, const char* dims_doc,
                    bool last_dim_contiguous);
Status check_dtype(const TensorView& view, const char* name, DType expected, const char* why);
Status check_device(const TensorView& view, const char* name, Device expected);
// Every dimension's extent; `like` says where the expectation comes from ("like q").
Status check_dims(const TensorView& view, const char* name, std::initializer_list<DimSpec> dims,
                  const char* like);
// The last dimension (head_dim) >= 1. Every other extent may be 0: such a call
// has an empty result (docs/semantics.md, "Empty tensors").
Status check_head_dim(const TensorView& view, const char* name, const char* dims_doc);
// Outputs: no two elements of the view may share memory (a view without
// elements never does, whatever its strides).
Status check_no_self_overlap(const TensorView& view, const char* name);

// A tensor that must look exactly like `like` (out, dout, dq, dk, dv, k_new...):
// given, of like's rank, dtype, device and shape, last dimension contiguous.
Status check_like(const TensorView& view, const char* name, const TensorView& like, const char* like_name,
                  const char* dims_doc);

// q, k, v of an attention call (softmax or linear): q of `q_rank`, k and v of
// `kv_rank` (they differ where packed queries read keys from pages), each
// given with a contiguous last dimension, float dtype (k, v like q), on q's
// device (a CUDA one only in a build with CUDA); k's last dimension
// (`dim_name`: "head_dim", "key_dim") like q's; heads_kv (k's second-to-last
// dimension) dividing heads_q (q's).
struct QkvDocs {
  const char* q;
  const char* k;
  const char* v;
};
Status check_query_key_value(const TensorView& q, const TensorView& k, const TensorView& v, int q_rank, int kv_rank,
                             const QkvDocs& docs, const char* dim_name);
// The same with q, k and v all of `rank`.
inline Status check_query_key_value(const TensorView& q, const TensorView& k, const TensorView& v, int rank,
                                    const QkvDocs& docs, const char* dim_name) {
  return check_query_key_value(q, k, v, rank, rank, docs, dim_name);
}

// The views a call reads and writes, by argument name, for the aliasing check.
struct NamedView {
  const char* name;
  TensorView view;
};

// No output overlaps an input or another output (empty views never do).
Status check_no_aliasing(const std::vector<NamedView>& outputs, const std::vector<NamedView>& inputs);

// Whether two views may touch a common byte. Exact for views with the same
// strides whose layout nests (each stride exceeds the span of the smaller
// ones), such as q, k, v sliced from one packed qkv tensor; otherwise it
// compares address ranges, which may report overlap for interleaved views.
bool views_overlap(const TensorView& a, const TensorView& b);
// Exactly the same elements: same data, dtype, shape and strides.
bool same_view(const TensorView& a, const TensorView& b);

}  // namespace cuflash::detail
