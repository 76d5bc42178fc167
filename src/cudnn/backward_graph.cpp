// The backward SDPA graph: dQ, dK, dV from Q, K, V, O, dO and the forward's
// stats, for dense and varlen (ragged) plans; GQA gradients summed by cuDNN.
#include <exception>

#include "cudnn_check.hpp"
#include "frontend.hpp"

namespace cuflash::detail::cudnn {

Status build_backward_graph(const SdpaPlan& plan, cudnnHandle_t handle, BuiltGraph* built) {
  try {
    const std::shared_ptr<FeGraph> graph = new_graph(plan);
    const fe::DataType_t io = io_data_type(plan.dtype);
    const QkvTensors qkv = add_qkv(*graph, plan);
    const FeTensor o = add_input(*graph, plan, Slot::o, io);
    const FeTensor dout = add_input(*graph, plan, Slot::dout, io);
    const FeTensor stats = add_input(*graph, plan, Slot::stats, fe::DataType_t::FLOAT);
    auto attributes = fe::graph::SDPA_backward_attributes()
                          .set_name("cuflash_sdpa_backward")
                          .set_attn_scale(add_attn_scale(*graph))
                          .set_deterministic_algorithm(plan.deterministic);
    apply_mask(*graph, plan, attributes);
    const auto [dq, dk, dv] = graph->sdpa_backward(qkv.q, qkv.k, qkv.v, o, dout, stats, attributes);
    describe_output(*graph, dq, plan, Slot::dq, io);
    describe_output(*graph, dk, plan, Slot::dk, io);
    describe_output(*graph, dv, plan, Slot::dv, io);
    return finish_build(graph, plan, handle, built);
  } catch (const std::exception& error) {
    return Status::unsupported("backend cudnn: cuDNN " + cudnn_runtime_version() +
                               " cannot build the backward graph of " + describe(plan) + ": " + error.what());
  }
}

}  // namespace cuflash::detail::cudnn
