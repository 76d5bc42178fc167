// The forward SDPA graph: O (and the stats) from Q, K, V for dense, varlen
// (ragged) and KV-cache (padded, optionally paged) plans.
#include <exception>

#include "cudnn_check.hpp"
#include "frontend.hpp"

namespace cuflash::detail::cudnn {

namespace {

fe::AttentionImplementation_t implementation(SdpaNode node) {
  switch (node) {
    case SdpaNode::composite: return fe::AttentionImplementation_t::COMPOSITE;
    case SdpaNode::unified: return fe::AttentionImplementation_t::UNIFIED;
    case SdpaNode::automatic: return fe::AttentionImplementation_t::AUTO;
  }
  return fe::AttentionImplementation_t::COMPOSITE;
}

}  // namespace

Status build_forward_graph(const SdpaPlan& plan, cudnnHandle_t handle, BuiltGraph* built) {
  try {
    const std::shared_ptr<FeGraph> graph = new_graph(plan);
    const QkvTensors qkv = add_qkv(*graph, plan);
    auto attributes = fe::graph::SDPA_attributes()
                          .set_name("cuflash_sdpa_forward")
                          .set_generate_stats(plan.generate_stats)
                          .set_attn_scale(add_attn_scale(*graph));
    attributes.set_implementation(implementation(plan.node));
    apply_mask(*graph, plan, attributes);
    if (plan.paged) add_page_tables(*graph, plan, attributes);
    const auto [o, stats] = graph->sdpa(qkv.q, qkv.k, qkv.v, attributes);
    describe_output(*graph, o, plan, Slot::o, io_data_type(plan.dtype));
    if (plan.generate_stats) describe_output(*graph, stats, plan, Slot::stats, fe::DataType_t::FLOAT);
    return finish_build(graph, plan, handle, built);
  } catch (const std::exception& error) {
    return Status::unsupported("backend cudnn: cuDNN " + cudnn_runtime_version() +
                               " cannot build the forward graph of " + describe(plan) + ": " + error.what());
  }
}

}  // namespace cuflash::detail::cudnn
