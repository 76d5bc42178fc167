// The cuda backend's backward plan (src/cuda/backward_plan.hpp) on a
// described H100 and A100, without a GPU: which calls the Hopper TMA kernel
// takes and what workspace it asks for. The kernels themselves are tested on
// the GPU by the backward suites (HopperTma/CudaBackward.* and the rest).
#include <gtest/gtest.h>

#include <utility>

#include "backward_plan.hpp"
#include "sm80/flash_bwd.hpp"
#include "common/attention_case.hpp"
#include "gpu/described_devices.hpp"
#include "gpu/gpu_cases.hpp"
#include "gpu/validated_problem.hpp"

namespace cuflash::test {
namespace {

using detail::BackwardKind;
using detail::BackwardPlan;
using detail::DeviceInfo;
using detail::Problem;

DeviceInfo h100() { return described_h100(); }

template <class Edit>
BackwardPlan plan(CaseSpec spec, const DeviceInfo& device, Edit edit) {
  if (spec.dtype == DType::f32) spec.dtype = DType::bf16;
  Problem p = validated_problem(spec, detail::Pass::backward);
  edit(p);
  const BackwardPlan planned = detail::plan_backward(p, device);
  // The sm80 kernels' plans ask for their workspace, the TMA kernel's for its own.
  if (planned.kind == BackwardKind::sm80) EXPECT_EQ(planned.workspace_bytes, detail::sm80_backward_workspace_bytes(p));
  return planned;
}

BackwardPlan plan(CaseSpec spec, const DeviceInfo& device) {
  return plan(std::move(spec), device, [](Problem&) {});
}

// Planned only in a library built with the sm_90a kernels.
bool tma_plannable() { return plan(dense_case("probe", 64, 64, 1, 1, 128, 1), h100()).kind == BackwardKind::tma; }

TEST(BackwardPlan, HopperDenseHeadDimsOfTheTableTakeTheTmaKernel) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  CaseSpec s = dense_case("d128", 300, 700, 8, 2, 128, 3);
  s.options.causal = true;
  const BackwardPlan p = plan(s, h100());
  EXPECT_EQ(p.kind, BackwardKind::tma);
  // The tensors the maps will encode: q/dout with the query heads, k/v with the kv heads.
  EXPECT_EQ(p.tma.q.heads, 8);
  EXPECT_EQ(p.tma.dout.heads, 8);
  EXPECT_EQ(p.tma.k.heads, 2);
  EXPECT_EQ(p.tma.k.rows, 700);
  EXPECT_EQ(p.tma.q.rows, 300);
  EXPECT_EQ(p.tma.q.batch, 3);
  // dQ accumulator, lse2 and dsum over 8 heads of padded rows: 900 rows + 64
  // per sequence and one more tile, rounded to tiles (1152).
  const std::size_t rows = 1152 * 8;
  EXPECT_EQ(p.workspace_bytes, rows * 128 * 4 + 2 * ((rows * 4 + 255) / 256 * 256));
  EXPECT_EQ(plan(dense_case("d64", 64, 64, 2, 2, 64, 1), h100()).kind, BackwardKind::tma);
  // Deterministic: the same kernel, plus a turn counter per 64-row dQ tile.
  const BackwardPlan ordered = plan(s, h100(), [](Problem& p) { p.deterministic = true; });
  EXPECT_EQ(ordered.kind, BackwardKind::tma);
  EXPECT_EQ(ordered.workspace_bytes, p.workspace_bytes + (rows / 64 * 4 + 255) / 256 * 256);
  // D = 256 (the wide kernel): a D = 256 accumulator, the same turn counters.
  CaseSpec wide = s;
  wide.head_dim = 256;
  const BackwardPlan wide_ordered = plan(wide, h100(), [](Problem& p) { p.deterministic = true; });
  EXPECT_EQ(wide_ordered.kind, BackwardKind::tma);
  EXPECT_EQ(wide_ordered.workspace_bytes,
            rows * 256 * 4 + 2 * ((rows * 4 + 255) / 256 * 256) + (rows / 64 * 4 + 255) / 256 * 256);
}

// Deterministic calls with ascending turns (no right bound) launch the key
// blocks of several chains (batch x kv head) interleaved, as many as half
// of L2 holds of their rows (sm90/bwd_chain_order.hpp); the default and
// causal calls keep the grid's order.
TEST(BackwardPlan, DeterministicAscendingCallsInterleaveTheirChains) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  auto ordered = [](Problem& p) { p.deterministic = true; };
  // 3 x 2 chains of 4 query heads x 300 rows x (128 x 8 + 8) bytes: all six fit.
  const CaseSpec s = dense_case("d128", 300, 700, 8, 2, 128, 3);
  EXPECT_EQ(plan(s, h100(), ordered).tma.chain_interleave, 6);
  EXPECT_EQ(plan(s, h100()).tma.chain_interleave, 1);
  CaseSpec causal = s;
  causal.options.causal = true;
  EXPECT_EQ(plan(causal, h100(), ordered).tma.chain_interleave, 1);
  // A window with a right bound: descending turns, the grid's order; with a left bound only, interleaved.
  EXPECT_EQ(plan(s, h100(), [](Problem& p) { p.deterministic = true; p.window_left = 100; p.window_right = 20; })
                .tma.chain_interleave,
            1);
  EXPECT_EQ(plan(s, h100(), [](Problem& p) { p.deterministic = true; p.window_left = 100; }).tma.chain_interleave, 6);
}

TEST(BackwardPlan, EverythingElseStaysOnTheSm80Kernels) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  auto sm80 = [](const BackwardPlan& p) { return p.kind == BackwardKind::sm80; };
  EXPECT_TRUE(sm80(plan(dense_case("ampere", 64, 64, 2, 2, 128, 1), described_a100())));
  DeviceInfo no_driver = h100();
  no_driver.tma_encoder = false;
  EXPECT_TRUE(sm80(plan(dense_case("no_encoder", 64, 64, 2, 2, 128, 1), no_driver)));
  EXPECT_TRUE(sm80(plan(dense_case("d96", 64, 64, 2, 2, 96, 1), h100())));
  EXPECT_TRUE(sm80(plan(dense_case("dropout", 64, 64, 2, 2, 128, 1), h100(), [](Problem& p) { p.dropout_p = 0.1f; })));
  CaseSpec f32 = dense_case("f32", 64, 64, 2, 2, 128, 1);
  EXPECT_TRUE(sm80(plan(f32, h100(), [](Problem& p) { p.dtype = DType::f32; })));
}

TEST(BackwardPlan, VarlenTakesTheTmaKernelAsOneBatchOfPackedRows) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  const CaseSpec spec = varlen_case("varlen", {5, 0, 35}, {12, 3, 20}, 4, 2, 128);
  const BackwardPlan p = plan(spec, h100());
  EXPECT_EQ(p.kind, BackwardKind::tma);
  EXPECT_EQ(p.tma.q.batch, 1);
  // Every packed row of the tensors, the unowned ones after cu_seqlens[B] too.
  EXPECT_EQ(p.tma.q.rows, 40 + spec.extra_rows);
  EXPECT_EQ(p.tma.k.rows, 35 + spec.extra_rows);
}

}  // namespace
}  // namespace cuflash::test
