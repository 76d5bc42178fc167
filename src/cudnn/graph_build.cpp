// What the forward and backward graph builders share (frontend.hpp).
#include <exception>
#include <string>

#include "cudnn_check.hpp"
#include "frontend.hpp"

namespace cuflash::detail::cudnn {

namespace {

std::vector<std::int64_t> dims_of(const TensorDesc& t) { return {t.dim[0], t.dim[1], t.dim[2], t.dim[3]}; }
std::vector<std::int64_t> strides_of(const TensorDesc& t) {
  return {t.stride[0], t.stride[1], t.stride[2], t.stride[3]};
}

FeTensor ragged_offset(FeGraph& graph, const SdpaPlan& plan, Slot slot) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name(std::string(slot_name(slot)) + "_ragged_offset")
                          .set_uid(uid::ragged_offset(slot))
                          .set_dim({plan.batch + 1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_data_type(fe::DataType_t::INT64));
}

// cuDNN's verdict on a graph step: a graph it cannot build or run is a valid
// call that this backend cannot take.
Status step_status(fe::error_t error, const char* step, const SdpaPlan& plan) {
  if (error.is_good()) return {};
  return Status::unsupported("backend cudnn: cuDNN " + cudnn_runtime_version() + " cannot run this call (" +
                             describe(plan) + "): " + step + ": " + error.get_message());
}

}  // namespace

fe::DataType_t io_data_type(DType dtype) {
  return dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

std::shared_ptr<FeGraph> new_graph(const SdpaPlan& plan) {
  auto graph = std::make_shared<FeGraph>();
  graph->set_io_data_type(io_data_type(plan.dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

FeTensor add_input(FeGraph& graph, const SdpaPlan& plan, Slot slot, fe::DataType_t type) {
  const TensorDesc& t = plan.tensor(slot);
  FeTensor tensor = graph.tensor(fe::graph::Tensor_attributes()
                                     .set_name(slot_name(slot))
                                     .set_uid(uid::of(slot))
                                     .set_dim(dims_of(t))
                                     .set_stride(strides_of(t))
                                     .set_data_type(type));
  if (t.ragged) tensor->set_ragged_offset(ragged_offset(graph, plan, slot));
  return tensor;
}

QkvTensors add_qkv(FeGraph& graph, const SdpaPlan& plan) {
  const fe::DataType_t io = io_data_type(plan.dtype);
  return {add_input(graph, plan, Slot::q, io), add_input(graph, plan, Slot::k, io), add_input(graph, plan, Slot::v, io)};
}

void describe_output(FeGraph& graph, const FeTensor& tensor, const SdpaPlan& plan, Slot slot, fe::DataType_t type) {
  const TensorDesc& t = plan.tensor(slot);
  tensor->set_output(true)
      .set_name(slot_name(slot))
      .set_uid(uid::of(slot))
      .set_dim(dims_of(t))
      .set_stride(strides_of(t))
      .set_data_type(type);
  if (t.ragged) tensor->set_ragged_offset(ragged_offset(graph, plan, slot));
}

FeTensor add_attn_scale(FeGraph& graph) {
  return graph.tensor(fe::graph::Tensor_attributes()
                          .set_name("attn_scale")
                          .set_uid(uid::attn_scale)
                          .set_dim({1, 1, 1, 1})
                          .set_stride({1, 1, 1, 1})
                          .set_is_pass_by_value(true)
                          .set_data_type(fe::DataType_t::FLOAT));
}

Status finish_build(const std::shared_ptr<FeGraph>& graph, const SdpaPlan& plan, cudnnHandle_t handle,
                    BuiltGraph* built) {
  const auto steps = [&]() -> Status {
    CUFLASH_TRY(step_status(graph->validate(), "validate", plan));
    CUFLASH_TRY(step_status(graph->build_operation_graph(handle), "build_operation_graph", plan));
    CUFLASH_TRY(step_status(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", plan));
    CUFLASH_TRY(step_status(graph->check_support(), "check_support", plan));
    CUFLASH_TRY(step_status(graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans", plan));
    std::int64_t workspace = 0;
    CUFLASH_TRY(step_status(graph->get_workspace_size(workspace), "get_workspace_size", plan));
    built->workspace_bytes = workspace;
    built->variant_uids = graph->get_variant_pack_uids_sorted();
    for (const std::int64_t id : built->variant_uids)
      if (id < 1 || id >= uid::count)
        return {StatusCode::internal, "backend cudnn: the graph of " + describe(plan) + " wants tensor uid " +
                                          std::to_string(id) + ", which cuflash does not bind"};
    return {};
  };
  Status status;
  try {
    status = steps();
  } catch (const std::exception& error) {
    // The frontend reports through error_t, but some of its helpers throw.
    status = Status::unsupported("backend cudnn: cuDNN " + cudnn_runtime_version() + " cannot run this call (" +
                                 describe(plan) + "): " + error.what());
  }
  if (status.ok()) built->graph = graph;
  return status;
}

}  // namespace cuflash::detail::cudnn
