// The cuda backend's backward plan (backward_plan.hpp).
#include "backward_plan.hpp"

#include "common/attention_params.hpp"
#include "common/env_switch.hpp"
#include "common/kernel_table.hpp"
#include "sm80/flash_bwd.hpp"
#include "sm90/bwd_chain_order.hpp"
#include "sm90/head_rows_tensor.hpp"
#include "sm90/tma_map.hpp"

namespace cuflash::detail {

namespace {

bool sm90_backward_enabled() {
  static const bool enabled = env_switch_on("CUFLASH_SM90_BACKWARD");
  return enabled;
}

// Deterministic calls whose key blocks add in ascending order (no right
// bound) launch the blocks of several chains (batch x kv head) interleaved
// (sm90/bwd_chain_order.hpp); a chain's per-row bytes: Q and dO (2 bytes an
// element), the fp32 dQ accumulator, lse2 and dsum, for its group of query
// heads. Elsewhere the grid's order: the default has no turns, and under a
// right bound the descending order already starts each block later than
// the one it waits for.
int tma_backward_chain_interleave(const Problem& problem) {
  if (!problem.deterministic || problem.window_right >= 0) return 1;
  const std::int64_t row_bytes = std::int64_t{problem.head_dim} * (2 + 2 + 4) + 8;
  const std::int64_t chain_bytes = row_bytes * problem.max_q_len * problem.group_size();
  return sm90::bwd_chain_interleave(chain_bytes, problem.batch * problem.heads_kv);
}

// The TMA kernel takes dense and varlen problems in fp16/bf16 at its own head dims,
// deterministic or not, without dropout (its tiles have no mask of it yet),
// whose q, k, v and dout can be TMA-mapped. Everything else stays on the sm80 kernels,
// which compute the same function.
bool tma_backward_fits(const Problem& problem, const DeviceInfo& info, sm90::TmaBackwardLaunch* launch) {
#if defined(CUFLASH_WITH_SM90A)
  if (!info.valid || info.major != 9 || info.minor != 0 || !info.tma_encoder || !sm90_backward_enabled())
    return false;
  if (problem.dtype != DType::bf16 && problem.dtype != DType::f16) return false;
  if (!kernel_table::contains(kernel_table::kTmaBackwardHeadDims, problem.head_dim)) return false;
  if (problem.layout == Layout::kv_cache || problem.has_dropout()) return false;
  launch->q = sm90::head_rows_tensor(problem, problem.q, problem.heads_q);
  launch->dout = sm90::head_rows_tensor(problem, problem.dout, problem.heads_q);
  launch->k = sm90::head_rows_tensor(problem, problem.k, problem.heads_kv);
  launch->v = sm90::head_rows_tensor(problem, problem.v, problem.heads_kv);
  launch->chain_interleave = tma_backward_chain_interleave(problem);
  return sm90::tma_layout_ok(launch->q) && sm90::tma_layout_ok(launch->dout) && sm90::tma_layout_ok(launch->k) &&
         sm90::tma_layout_ok(launch->v);
#else
  (void)problem;
  (void)info;
  (void)launch;
  return false;
#endif
}

}  // namespace

BackwardPlan plan_backward(const Problem& problem, const DeviceInfo& device) {
  BackwardPlan plan;
  if (tma_backward_fits(problem, device, &plan.tma)) {
    plan.kind = BackwardKind::tma;
    plan.workspace_bytes =
        sm90::tma_backward_workspace(total_q_rows(problem), problem.batch, problem.heads_q, problem.head_dim,
                                     problem.deterministic)
            .bytes;
    return plan;
  }
  plan.tma = {};
  plan.workspace_bytes = sm80_backward_workspace_bytes(problem);
  return plan;
}

BackwardPlan plan_backward(const Problem& problem) {
  return plan_backward(problem, device_info(problem.device.index));
}

}  // namespace cuflash::detail
