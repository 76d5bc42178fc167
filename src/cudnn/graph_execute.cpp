// Launching a built graph: the call's addresses in the order the frontend
// keeps its tensors (sorted by uid), handed over without a map per call.
#include <exception>
#include <string>

#include "frontend.hpp"

namespace cuflash::detail::cudnn {

Status execute_graph(const BuiltGraph& built, cudnnHandle_t handle, const VariantPack& pack, void* workspace) {
  void* pointers[uid::count] = {};
  const int count = static_cast<int>(built.variant_uids.size());
  if (count > uid::count) return {StatusCode::internal, "backend cudnn: the graph binds more tensors than cuflash has"};
  for (int i = 0; i < count; ++i) {
    pointers[i] = pack.by_uid[built.variant_uids[i]];
    if (pointers[i] == nullptr)
      return {StatusCode::internal,
              "backend cudnn: no address for graph tensor uid " + std::to_string(built.variant_uids[i])};
  }
  try {
    const auto* graph = static_cast<const FeGraph*>(built.graph.get());
    fe::error_t error = graph->execute(handle, pointers, count, workspace);
    if (error.is_bad()) return {StatusCode::cudnn_error, "backend cudnn: cuDNN execute failed: " + error.get_message()};
  } catch (const std::exception& error) {
    return {StatusCode::cudnn_error, std::string("backend cudnn: cuDNN execute failed: ") + error.what()};
  }
  return {};
}

}  // namespace cuflash::detail::cudnn
