// The one include of the cuDNN frontend (header-only and heavy: the files
// that include this are compiled as one unity source, src/CMakeLists.txt),
// and what the graph files share: dtype mapping, tensors from a plan's
// descriptors, the mask, the build sequence and error conversion.
#pragma once

#include <cudnn_frontend.h>

#include <memory>
#include <string>

#include "cuflash/status.hpp"
#include "sdpa_graph.hpp"
#include "sdpa_plan.hpp"

namespace cuflash::detail::cudnn {

namespace fe = cudnn_frontend;
using FeGraph = fe::graph::Graph;
using FeTensor = std::shared_ptr<fe::graph::Tensor_attributes>;

fe::DataType_t io_data_type(DType dtype);

// A graph with the plan's dtypes: I/O in f16/bf16, softmax and accumulation in float.
std::shared_ptr<FeGraph> new_graph(const SdpaPlan& plan);

// Input tensors (with their ragged offsets); outputs get the plan's dims/strides.
FeTensor add_input(FeGraph& graph, const SdpaPlan& plan, Slot slot, fe::DataType_t type);
struct QkvTensors {
  FeTensor q, k, v;
};
QkvTensors add_qkv(FeGraph& graph, const SdpaPlan& plan);
void describe_output(FeGraph& graph, const FeTensor& tensor, const SdpaPlan& plan, Slot slot, fe::DataType_t type);
// The softmax scale, passed by value at each launch (so it is not in the key).
FeTensor add_attn_scale(FeGraph& graph);

// The diagonal band, its alignment, and the padding mask's length tensors.
template <typename Attributes>
void apply_mask(FeGraph& graph, const SdpaPlan& plan, Attributes& attributes) {
  if (plan.right_bound >= 0) attributes.set_diagonal_band_right_bound(plan.right_bound);
  if (plan.left_bound >= 0) attributes.set_diagonal_band_left_bound(plan.left_bound);
  if (plan.right_bound >= 0 || plan.left_bound >= 0)
    attributes.set_diagonal_alignment(plan.bottom_right ? fe::DiagonalAlignment_t::BOTTOM_RIGHT
                                                        : fe::DiagonalAlignment_t::TOP_LEFT);
  if (!plan.padding_mask) return;
  auto lengths = [&](const char* name, std::int64_t id) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(id)
                            .set_dim({plan.batch, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  attributes.set_padding_mask(true)
      .set_seq_len_q(lengths("seq_len_q", uid::seq_len_q))
      .set_seq_len_kv(lengths("seq_len_kv", uid::seq_len_kv));
}

// Paged KV cache: page tables for K and V (paged_forward.cpp).
void add_page_tables(FeGraph& graph, const SdpaPlan& plan, fe::graph::SDPA_attributes& attributes);

// validate, operation graph, heuristics, support check, plan; then the
// workspace size and the uids that execute binds.
Status finish_build(const std::shared_ptr<FeGraph>& graph, const SdpaPlan& plan, cudnnHandle_t handle,
                    BuiltGraph* built);

}  // namespace cuflash::detail::cudnn
