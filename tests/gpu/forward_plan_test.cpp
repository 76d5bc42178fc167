// The cuda backend's forward plan (src/cuda/forward_plan.hpp) on a described
// H100, without a GPU: which kernel the rules pick, when the TMA kernel's
// CTAs walk (and when causal calls walk in pairs), and when the keys split.
// Problems come from the real validation of host test cases. The numbers are
// the measured rules' (docs/perf/NOTES.md); the kernels themselves are tested
// on the GPU by the forward suites.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "common/attention_case.hpp"
#include "forward_plan.hpp"
#include "gpu/described_devices.hpp"
#include "gpu/gpu_cases.hpp"
#include "gpu/validated_problem.hpp"

namespace cuflash::test {
namespace {

using detail::DeviceInfo;
using detail::ForwardKind;
using detail::ForwardPlan;
using detail::Problem;

DeviceInfo h100() { return described_h100(); }
DeviceInfo a100() { return described_a100(); }

// Plans a bf16 case (validated_problem.hpp); `edit` changes the validated
// problem first.
template <class Edit>
ForwardPlan plan(CaseSpec spec, const DeviceInfo& device, Edit edit) {
  spec.dtype = DType::bf16;
  Problem p = validated_problem(spec, detail::Pass::forward);
  edit(p);
  return detail::plan_forward(p, device);
}

ForwardPlan plan(CaseSpec spec, const DeviceInfo& device) {
  return plan(std::move(spec), device, [](Problem&) {});
}

CaseSpec causal_case(CaseSpec s) {
  s.options.causal = true;
  return s;
}

TEST(ForwardPlan, AmpereRunsTheSm80Kernel) {
  const ForwardPlan p = plan(dense_case("d128", 512, 512, 16, 16, 128, 2), a100());
  EXPECT_EQ(p.kind, ForwardKind::sm80);
  EXPECT_EQ(p.tma.persistent_ctas, 0);
}


// The TMA kernel is planned only in a library built with the sm_90a
// kernels (the described H100 has a driver to encode the maps with).
bool tma_plannable() {
  return plan(dense_case("probe", 128, 128, 1, 1, 128, 1), h100()).kind == ForwardKind::tma;
}

TEST(ForwardPlan, HopperHeadDimsAndKeys) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  const ForwardPlan d128 = plan(dense_case("d128", 512, 512, 16, 16, 128, 2), h100());
  EXPECT_EQ(d128.kind, ForwardKind::tma);
  EXPECT_EQ(d128.tile.block_m, 128);
  // D = 64 takes TMA from 2048 keys with three consumers; below, without a
  // mask when its grid (192-row blocks x heads x batch) fills the SMs once,
  // and with two consumers on a grid of at most one 128-row block per SM
  // over more than 128 keys and on dense causal calls, else the cp.async
  // wgmma kernel.
  EXPECT_EQ(plan(dense_case("d64_short", 512, 512, 8, 8, 64, 6), h100()).kind, ForwardKind::tma);  // 144 items
  EXPECT_EQ(plan(dense_case("d64_short_small_grid", 512, 512, 8, 8, 64, 5), h100()).kind,
            ForwardKind::wgmma);  // 120 items of 192 rows, 160 of 128
  const ForwardPlan short_causal = plan(causal_case(dense_case("d64_short_causal", 512, 512, 8, 8, 64, 5)), h100());
  EXPECT_EQ(short_causal.kind, ForwardKind::tma);
  EXPECT_EQ(short_causal.tile.block_m, 128);
  EXPECT_TRUE(short_causal.tma.causal_walk);
  EXPECT_EQ(short_causal.tma.persistent_ctas, 132);
  const ForwardPlan causal_2047 = plan(causal_case(dense_case("d64_causal", 2048, 2047, 8, 8, 64, 2)), h100());
  EXPECT_EQ(causal_2047.kind, ForwardKind::tma);
  EXPECT_EQ(causal_2047.tile.block_m, 128);
  // From 2048 keys three consumers, unless the grid is light: fewer than
  // 128 key-tile steps per SM (B = 2 x 8 heads: 12; B = 32 x 8 heads, the
  // batch set on the problem so that no host tensors are filled: 196).
  const ForwardPlan light_causal = plan(causal_case(dense_case("d64_light_causal", 2048, 2048, 8, 8, 64, 2)), h100());
  EXPECT_EQ(light_causal.tile.block_m, 128);
  EXPECT_EQ(light_causal.tma.persistent_ctas, 132);  // walked in pairs
  const ForwardPlan long_causal = plan(causal_case(dense_case("d64_long_causal", 2048, 2048, 8, 8, 64, 2)), h100(),
                                       [](Problem& p) { p.batch = 32; });
  EXPECT_EQ(long_causal.kind, ForwardKind::tma);
  EXPECT_EQ(long_causal.tile.block_m, 192);
  // The light grid's limit: B = 4 x 16 heads at 4096 keys is 186 steps.
  EXPECT_EQ(plan(causal_case(dense_case("d64_causal_4k", 4096, 4096, 16, 16, 64, 1)), h100(),
                 [](Problem& p) { p.batch = 4; }).tile.block_m,
            192);
  EXPECT_EQ(plan(causal_case(dense_case("d64_causal_4k", 4096, 4096, 16, 16, 64, 1)), h100(),
                 [](Problem& p) { p.batch = 2; }).tile.block_m,
            128);
  // Not from the walk's 8192 keys on (causal items of that length are not
  // walked), where the items fill more than one round (8 heads: 87 steps).
  EXPECT_EQ(plan(causal_case(dense_case("d64_causal_8k", 8192, 8192, 1, 1, 64, 1)), h100(),
                 [](Problem& p) { p.heads_q = p.heads_kv = 8; }).tile.block_m,
            192);
  // Softcap (no two-consumer instantiation) and windows (not measured) stay
  // on the cp.async kernel below 2048 keys.
  EXPECT_EQ(plan(causal_case(dense_case("d64_short_causal_softcap", 512, 512, 8, 8, 64, 5)), h100(),
                 [](Problem& p) { p.softcap = 30.0f; }).kind,
            ForwardKind::wgmma);
  // Varlen causal calls (not walked; two consumers not measured there) too,
  // on a grid of more than one 128-row item per SM (3 x 16 x 3 = 144).
  EXPECT_EQ(plan(causal_case(varlen_case("d64_varlen_causal", {300, 1, 129}, {1000, 5, 300}, 16, 4, 64)), h100()).kind,
            ForwardKind::wgmma);
  CaseSpec windowed = dense_case("d64_short_window", 512, 512, 8, 8, 64, 5);
  windowed.options.window_left = 100;
  windowed.options.window_right = 0;
  EXPECT_EQ(plan(windowed, h100()).kind, ForwardKind::wgmma);
  // One sequence of 16 heads: 128 blocks of 64 rows, one wave: two
  // consumers, splitting each block's key tiles.
  const ForwardPlan few = plan(causal_case(dense_case("d64_few_items", 512, 512, 16, 16, 64, 1)), h100());
  EXPECT_EQ(few.kind, ForwardKind::tma);
  EXPECT_EQ(few.tile.block_m, 64);
  EXPECT_TRUE(few.tma.few_items);
  EXPECT_TRUE(few.tma.split_keys);
  // Two sequences: 256 blocks of 64 rows, 128 of 128: two consumers on
  // blocks of 128 rows.
  const ForwardPlan few_128 = plan(dense_case("d64_few_items_128_rows", 512, 512, 16, 16, 64, 2), h100());
  EXPECT_EQ(few_128.kind, ForwardKind::tma);
  EXPECT_EQ(few_128.tile.block_m, 128);
  EXPECT_TRUE(few_128.tma.few_items);
  EXPECT_FALSE(few_128.tma.split_keys);
  // With a window too (its key range is the item's tiles).
  EXPECT_TRUE(plan(dense_case("d64_few_items_window", 512, 512, 16, 16, 64, 1), h100(), [](Problem& p) {
                p.window_left = 100;
                p.window_right = 40;
              }).tma.split_keys);
  // From 2048 keys (where split-KV may take such grids) no split keys.
  EXPECT_FALSE(plan(dense_case("d64_few_items_long", 2048, 2048, 2, 2, 64, 1), h100()).tma.split_keys);
  // At D = 128 on 64-key tiles (four stages: two per consumer), below 1024
  // keys (16 such tiles, where split-KV may take the grid).
  const ForwardPlan d128_split = plan(dense_case("d128_few_items", 512, 512, 16, 16, 128, 1), h100());
  EXPECT_EQ(d128_split.kind, ForwardKind::tma);
  EXPECT_TRUE(d128_split.tma.split_keys);
  EXPECT_EQ(d128_split.tile.block_m, 64);
  EXPECT_EQ(d128_split.tile.block_n, 64);
  EXPECT_FALSE(plan(dense_case("d128_few_items_1k", 1024, 1024, 8, 8, 128, 1), h100()).tma.split_keys);
  EXPECT_FALSE(plan(dense_case("d128_one_split_tile", 64, 64, 16, 16, 128, 1), h100()).tma.split_keys);
  // Nor over one of D = 128's own 128-key tiles (two of the split kernel's).
  EXPECT_FALSE(plan(dense_case("d128_one_tile", 128, 128, 16, 16, 128, 1), h100()).tma.split_keys);
  EXPECT_TRUE(plan(dense_case("d128_two_tiles", 129, 129, 16, 16, 128, 1), h100()).tma.split_keys);
  // The compute-sanitizer subset's split-keys cases (forward_matrix.cpp) take it.
  EXPECT_TRUE(plan(causal_case(dense_case("fwd_split_keys_causal_d128", 130, 200, 2, 1, 128, 1)), h100())
                  .tma.split_keys);
  CaseSpec split_window = dense_case("fwd_split_keys_window_d64", 150, 450, 2, 2, 64, 1);
  split_window.options.window_left = 100;
  split_window.options.window_right = 30;
  EXPECT_TRUE(plan(split_window, h100()).tma.split_keys);
  // One key tile: the cp.async kernel.
  EXPECT_EQ(plan(dense_case("d64_one_key_tile", 128, 128, 16, 16, 64, 1), h100()).kind, ForwardKind::wgmma);
  // Softcap has no two-consumer plain instantiation to take: the cp.async kernel.
  EXPECT_EQ(plan(dense_case("d64_few_items_softcap", 512, 512, 16, 16, 64, 1), h100(),
                 [](Problem& p) { p.softcap = 30.0f; }).kind,
            ForwardKind::wgmma);
  EXPECT_FALSE(plan(dense_case("d64_long", 4096, 4096, 16, 16, 64, 4), h100()).tma.few_items);
  // Without a mask, two consumers wherever their items take no more rounds
  // of the walk than three's: B = 1 x 16 heads at 2048 keys, 256 items of
  // 128 rows against 176 of 192, two rounds each; B = 2, 512 against 352,
  // four rounds against three.
  const ForwardPlan same_rounds = plan(dense_case("d64_same_rounds", 2048, 2048, 16, 16, 64, 1), h100());
  EXPECT_EQ(same_rounds.tile.block_m, 128);
  EXPECT_TRUE(same_rounds.tma.few_items);
  EXPECT_FALSE(same_rounds.tma.split_keys);
  EXPECT_EQ(plan(dense_case("d64_more_rounds", 2048, 2048, 16, 16, 64, 1), h100(), [](Problem& p) {
              p.batch = 2;
            }).tile.block_m,
            192);
  // 96 has no Hopper kernel of its own: the 128 TMA kernel's 96 columns.
  EXPECT_EQ(plan(dense_case("d96", 256, 256, 4, 4, 96, 1), h100()).kind, ForwardKind::tma);
}

// Without a driver to encode the maps (tma_encoder false) the same call
// takes the cp.async wgmma kernel.
TEST(ForwardPlan, NoTmaWithoutTheEncoder) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  DeviceInfo no_driver = h100();
  no_driver.tma_encoder = false;
  EXPECT_EQ(plan(dense_case("d128", 512, 512, 16, 16, 128, 2), no_driver).kind, ForwardKind::wgmma);
}

TEST(ForwardPlan, WhichCallsWalk) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  // Dense, no mask: one CTA per SM walks.
  ForwardPlan p = plan(dense_case("dense", 512, 512, 16, 16, 128, 4), h100());
  EXPECT_EQ(p.tma.persistent_ctas, 132);
  EXPECT_FALSE(p.tma.causal_walk);
  // Causal below 8k keys on the two-consumer kernel: walked, in pairs.
  p = plan(causal_case(dense_case("causal", 512, 512, 16, 16, 128, 4)), h100());
  EXPECT_EQ(p.tma.persistent_ctas, 132);
  EXPECT_TRUE(p.tma.causal_walk);
  // Causal from 8k keys: one CTA per item.
  p = plan(causal_case(dense_case("causal_long", 64, 8192, 2, 2, 128, 1)), h100());
  EXPECT_EQ(p.tma.persistent_ctas, 0);
  // Causal on the three-consumer D = 64 kernel (a grid of 196 key-tile
  // steps per SM): one CTA per item; on a lighter grid, two consumers
  // walked in pairs.
  p = plan(causal_case(dense_case("causal_d64", 2048, 2048, 16, 16, 64, 2)), h100(), [](Problem& q) { q.batch = 16; });
  EXPECT_EQ(p.kind, ForwardKind::tma);
  EXPECT_EQ(p.tile.block_m, 192);
  EXPECT_EQ(p.tma.persistent_ctas, 0);
  p = plan(causal_case(dense_case("causal_d64_light", 2048, 2048, 16, 16, 64, 2)), h100());
  EXPECT_EQ(p.tile.block_m, 128);
  EXPECT_EQ(p.tma.persistent_ctas, 132);
  // D = 256 (one Q buffer, released before the epilogue) walks below 8k
  // keys, causal in pairs too; D = 192 and windows: one CTA per item.
  EXPECT_EQ(plan(dense_case("d256", 512, 512, 8, 8, 256, 2), h100()).tma.persistent_ctas, 132);
  EXPECT_EQ(plan(dense_case("d256_long", 64, 8192, 2, 2, 256, 1), h100()).tma.persistent_ctas, 0);
  p = plan(causal_case(dense_case("causal_d256", 1024, 1024, 8, 8, 256, 2)), h100());
  EXPECT_EQ(p.tma.persistent_ctas, 132);
  EXPECT_TRUE(p.tma.causal_walk);
  EXPECT_EQ(plan(dense_case("d192", 512, 512, 8, 8, 192, 2), h100()).tma.persistent_ctas, 0);
  CaseSpec w = dense_case("window", 512, 512, 8, 8, 128, 2);
  w.options.window_left = 100;
  EXPECT_EQ(plan(w, h100()).tma.persistent_ctas, 0);
}

// D = 128 takes the deeper ring from 2048 keys, with plain scores at the
// kernel's full width only; the other head dims have none.
TEST(ForwardPlan, DeepRingForLongKeys) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  EXPECT_TRUE(plan(dense_case("d128_long", 256, 2048, 4, 4, 128, 1), h100()).tma.deep_ring);
  EXPECT_TRUE(plan(causal_case(dense_case("d128_causal", 4096, 4096, 2, 2, 128, 1)), h100()).tma.deep_ring);
  EXPECT_FALSE(plan(dense_case("d128_short", 2048, 2047, 4, 4, 128, 1), h100()).tma.deep_ring);
  CaseSpec capped = dense_case("d128_softcap", 256, 4096, 4, 4, 128, 1);
  capped.options.softcap = 10.0f;
  EXPECT_FALSE(plan(capped, h100()).tma.deep_ring);
  const ForwardPlan d96 = plan(dense_case("d96_long", 256, 4096, 4, 4, 96, 1), h100());
  EXPECT_EQ(d96.kind, ForwardKind::tma);
  EXPECT_FALSE(d96.tma.deep_ring);
  EXPECT_FALSE(plan(dense_case("d64_long", 256, 4096, 4, 4, 64, 1), h100()).tma.deep_ring);
  EXPECT_FALSE(plan(dense_case("d256_long", 256, 4096, 4, 4, 256, 1), h100()).tma.deep_ring);
}

// D = 256 takes 64-key tiles below 1024 keys, with plain scores at the
// kernel's full width only; the other head dims keep their tiles.
TEST(ForwardPlan, ShortTilesForShortKeys) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  const ForwardPlan short_keys = plan(causal_case(dense_case("d256_short", 512, 512, 4, 4, 256, 2)), h100());
  EXPECT_EQ(short_keys.kind, ForwardKind::tma);
  EXPECT_TRUE(short_keys.tma.short_tiles);
  EXPECT_EQ(short_keys.tile.block_n, 64);
  // Without a mask the 80-key tiles measured level with the 64-key ones.
  const ForwardPlan unmasked = plan(dense_case("d256_short_unmasked", 512, 512, 4, 4, 256, 2), h100());
  EXPECT_FALSE(unmasked.tma.short_tiles);
  EXPECT_EQ(unmasked.tile.block_n, 80);
  const ForwardPlan keys_1k = plan(causal_case(dense_case("d256_1k", 1024, 1024, 4, 4, 256, 2)), h100());
  EXPECT_FALSE(keys_1k.tma.short_tiles);
  EXPECT_EQ(keys_1k.tile.block_n, 80);
  CaseSpec capped = causal_case(dense_case("d256_softcap", 512, 512, 4, 4, 256, 2));
  capped.options.softcap = 10.0f;
  EXPECT_FALSE(plan(capped, h100()).tma.short_tiles);
  // D = 224 runs on the D = 256 kernel at its full width (TMA fills the
  // columns past 224 with zeros), so it takes that kernel's short tiles.
  EXPECT_TRUE(plan(causal_case(dense_case("d224_short", 512, 512, 4, 4, 224, 2)), h100()).tma.short_tiles);
  EXPECT_FALSE(plan(causal_case(dense_case("d128_short", 512, 512, 4, 4, 128, 2)), h100()).tma.short_tiles);
}

// D = 128 takes three Q buffers below 2048 keys (its own kernel), with
// plain scores at the kernel's full width, causal or not; from 2048 keys
// the deep ring (one Q buffer); the other head dims keep theirs.
TEST(ForwardPlan, ShortQBuffersForShortKeys) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  // (16 heads: 256 blocks of 64 rows, more than a wave: not split keys.)
  const ForwardPlan causal = plan(causal_case(dense_case("d128_causal_512", 512, 512, 16, 16, 128, 2)), h100());
  EXPECT_EQ(causal.kind, ForwardKind::tma);
  EXPECT_TRUE(causal.tma.short_q_buffers);
  EXPECT_TRUE(plan(dense_case("d128_unmasked_1k", 1024, 1024, 4, 4, 128, 2), h100()).tma.short_q_buffers);
  EXPECT_TRUE(plan(dense_case("d128_2047", 256, 2047, 4, 4, 128, 2), h100()).tma.short_q_buffers);
  const ForwardPlan long_keys = plan(dense_case("d128_2k", 256, 2048, 4, 4, 128, 1), h100());
  EXPECT_FALSE(long_keys.tma.short_q_buffers);
  EXPECT_TRUE(long_keys.tma.deep_ring);
  CaseSpec capped = dense_case("d128_softcap_512", 512, 512, 4, 4, 128, 2);
  capped.options.softcap = 10.0f;
  EXPECT_FALSE(plan(capped, h100()).tma.short_q_buffers);
  // D = 96 runs on the D = 128 kernel over fewer columns: not at full width.
  EXPECT_FALSE(plan(dense_case("d96_512", 512, 512, 4, 4, 96, 2), h100()).tma.short_q_buffers);
  EXPECT_FALSE(plan(causal_case(dense_case("d64_512", 512, 512, 4, 4, 64, 2)), h100()).tma.short_q_buffers);
  EXPECT_FALSE(plan(causal_case(dense_case("d256_512", 512, 512, 4, 4, 256, 2)), h100()).tma.short_q_buffers);
}

// The launch encodes the tensors the plan checked: they describe the views.
TEST(ForwardPlan, TmaTensorsDescribeTheViews) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  Problem dense;
  const ForwardPlan d = plan(dense_case("gqa", 384, 640, 8, 2, 128, 3), h100(), [&](Problem& p) { dense = p; });
  ASSERT_EQ(d.kind, ForwardKind::tma);
  EXPECT_EQ(d.tma.q.base, dense.q.data);
  EXPECT_EQ(d.tma.k.base, dense.k.data);
  EXPECT_EQ(d.tma.v.base, dense.v.data);
  EXPECT_EQ(d.tma.q.batch, 3);
  EXPECT_EQ(d.tma.q.rows, 384);
  EXPECT_EQ(d.tma.k.rows, 640);
  EXPECT_EQ(d.tma.q.heads, 8);
  EXPECT_EQ(d.tma.v.heads, 2);
  EXPECT_EQ(d.tma.q.head_dim, 128);
  EXPECT_EQ(d.tma.q.strides.batch, dense.q.strides[0]);
  EXPECT_EQ(d.tma.k.strides.row, dense.k.strides[1]);
  EXPECT_EQ(d.tma.v.strides.head, dense.v.strides[2]);
  ASSERT_TRUE(d.tma.out_by_tma);
  EXPECT_EQ(d.tma.out.base, dense.out.data);
  EXPECT_EQ(d.tma.out.rows, 384);
  EXPECT_EQ(d.tma.out.strides.row, dense.out.strides[1]);
  // Varlen: one batch of the packed rows, no batch stride.
  Problem packed;
  const ForwardPlan v =
      plan(varlen_case("varlen", {300, 700}, {200, 900}, 4, 4, 128), h100(), [&](Problem& p) { packed = p; });
  ASSERT_EQ(v.kind, ForwardKind::tma);
  EXPECT_EQ(v.tma.q.batch, 1);
  EXPECT_EQ(v.tma.q.rows, packed.q.shape[0]);
  EXPECT_EQ(v.tma.k.rows, packed.k.shape[0]);
  EXPECT_EQ(v.tma.k.strides.batch, 0);
  EXPECT_EQ(v.tma.k.strides.row, packed.k.strides[0]);
  EXPECT_EQ(v.tma.k.strides.head, packed.k.strides[1]);
}

TEST(ForwardPlan, WhichCallsStoreByTma) {
  if (!tma_plannable()) GTEST_SKIP() << "no sm_90a kernels in this build";
  const char* store = std::getenv("CUFLASH_TMA_STORE");
  if (store != nullptr && std::string(store) == "0") GTEST_SKIP() << "CUFLASH_TMA_STORE=0 turns the TMA store off";
  // Dense and unsplit: O leaves through TMA stores.
  EXPECT_TRUE(plan(dense_case("dense", 512, 512, 16, 16, 128, 4), h100()).tma.out_by_tma);
  // No output view (a workspace query): no store planned, and no view read.
  EXPECT_FALSE(plan(dense_case("no_out", 512, 512, 16, 16, 128, 4), h100(), [](Problem& p) {
                 p.out = TensorView{};
               }).tma.out_by_tma);
  // Varlen: a block past a sequence's end would overwrite the next one's rows.
  const ForwardPlan v = plan(varlen_case("varlen", {300, 700}, {300, 700}, 4, 4, 128), h100());
  EXPECT_EQ(v.kind, ForwardKind::tma);
  EXPECT_FALSE(v.tma.out_by_tma);
  // Split keys: the partials are fp32 rows of the workspace.
  const ForwardPlan s = plan(dense_case("decode", 1, 8192, 2, 1, 128, 1), h100());
  ASSERT_EQ(s.kind, ForwardKind::tma);
  ASSERT_GT(s.splits, 1);
  EXPECT_FALSE(s.tma.out_by_tma);
}

TEST(ForwardPlan, SplitsOnlyLongKeysOnSmallGrids) {
  // B = 1 x 16 heads at 512 keys: already most SMs busy, short keys: no split.
  EXPECT_EQ(plan(dense_case("small", 512, 512, 16, 16, 128, 1), h100()).splits, 1);
  // Decode-like: one query row over long keys splits, and the workspace holds the partials.
  const ForwardPlan p = plan(dense_case("decode", 1, 8192, 2, 1, 128, 1), h100());
  EXPECT_GT(p.splits, 1);
  EXPECT_GT(p.workspace_bytes, 0u);
  // Large grids never split.
  EXPECT_EQ(plan(dense_case("large", 1024, 1024, 16, 16, 128, 4), h100()).splits, 1);
}

}  // namespace
}  // namespace cuflash::test
