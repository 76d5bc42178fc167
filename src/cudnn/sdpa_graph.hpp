// Building and running the cuDNN SDPA graphs of a plan. This header does not
// include the cuDNN frontend; the files that implement it do.
#pragma once

#include <cudnn.h>

#include <cstdint>

#include "cuflash/status.hpp"
#include "graph_cache.hpp"
#include "sdpa_plan.hpp"

namespace cuflash::detail::cudnn {

// The uids of a graph's tensors: the slots, the scalar and index inputs, and
// one ragged-offset tensor per ragged slot.
namespace uid {
inline constexpr std::int64_t of(Slot slot) { return 1 + slot_index(slot); }
inline constexpr std::int64_t attn_scale = 1 + kSlots;
inline constexpr std::int64_t seq_len_q = attn_scale + 1;
inline constexpr std::int64_t seq_len_kv = attn_scale + 2;
inline constexpr std::int64_t page_table_k = attn_scale + 3;
inline constexpr std::int64_t page_table_v = attn_scale + 4;
inline constexpr std::int64_t ragged_offset(Slot slot) { return attn_scale + 5 + slot_index(slot); }
inline constexpr std::int64_t count = attn_scale + 5 + kSlots;
}  // namespace uid

// The address every uid of a call is bound to: device memory, except
// attn_scale, a host float that cuDNN reads by value at launch.
struct VariantPack {
  void* by_uid[uid::count] = {};
};

// Build `plan`'s graph on `handle` (whose device is current): validation,
// operation graph, heuristics, plan. A graph cuDNN cannot run is `unsupported`
// with cuDNN's reason.
Status build_forward_graph(const SdpaPlan& plan, cudnnHandle_t handle, BuiltGraph* built);
Status build_backward_graph(const SdpaPlan& plan, cudnnHandle_t handle, BuiltGraph* built);

// Launches `graph` on the stream `handle` is bound to.
Status execute_graph(const BuiltGraph& graph, cudnnHandle_t handle, const VariantPack& pack, void* workspace);

}  // namespace cuflash::detail::cudnn
