// The cuda backend's forward plan (forward_plan.hpp): the kernel choice,
// the split rule and the TMA kernel's walk, from the problem and the device.
#include "forward_plan.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/env_switch.hpp"
#include "sm80/combine_splits.hpp"
#include "sm80/head_dims.hpp"
#include "sm90/flash_fwd_wgmma_tiles.hpp"
#include "sm90/head_rows_tensor.hpp"
#include "sm90/tma_map.hpp"

namespace cuflash::detail {

namespace {

constexpr int kMaxSplits = 64;

// The kernel a problem runs on and its tile. On an sm_90 device (when the
// sm_90a kernels were built): the warp-specialized TMA kernel where it has
// the head dim, the tensors can be TMA-mapped and it wins (tma_wins), else
// the cp.async wgmma kernel where it has the head dim; the sm80 kernel
// otherwise. All compute the same function. CUFLASH_SM90_FORWARD=0 in the
// environment keeps Hopper on the sm80 kernel, CUFLASH_SM90_TMA=0 on the
// cp.async wgmma kernel (for comparing them); both are read once per
// process. The Hopper kernels take
// only their own head dims (TMA boxes and wgmma shapes of whole rows); a
// narrower head dim runs on the sm80 kernel of the next dim up.
struct ForwardKernel {
  ForwardKind kind = ForwardKind::sm80;
  sm80::FwdTile tile{};
  int tma_consumers = 0;  // the TMA kernel's consumer warpgroups (kind tma)
  // Kind tma: its split-keys kernel (tma_split_keys) and its short key
  // tiles (tma_short_tiles), decided once for the tile and the launch.
  bool tma_split_keys = false;
  bool tma_short_tiles = false;
};

bool sm90_forward_enabled() {
  static const bool enabled = env_switch_on("CUFLASH_SM90_FORWARD");
  return enabled;
}

bool sm90_tma_enabled() {
  static const bool enabled = env_switch_on("CUFLASH_SM90_TMA");
  return enabled;
}

// CUFLASH_TMA_STORE=0 keeps the TMA kernel's output on per-thread stores
// (read once; for measuring the TMA store).
bool tma_store_enabled() {
  static const bool enabled = env_switch_on("CUFLASH_TMA_STORE");
  return enabled;
}

// Whether the TMA kernel's maps of q, k and v can be encoded on `info`.
bool tma_maps_fit(const Problem& problem, const DeviceInfo& info) {
  return info.tma_encoder && sm90::tma_layout_ok(sm90::head_rows_tensor(problem, problem.q, problem.heads_q)) &&
         sm90::tma_layout_ok(sm90::head_rows_tensor(problem, problem.k, problem.heads_kv)) &&
         sm90::tma_layout_ok(sm90::head_rows_tensor(problem, problem.v, problem.heads_kv));
}

// The TMA kernel's tile for a problem's head dim (block_n 0: none).
sm90::TmaFwdTile tma_fwd_tile_for(const Problem& problem) {
  return sm90::tma_fwd_tile(sm90::tma_head_dim(problem.head_dim));
}

// The TMA kernel's work items (query blocks of 64 x consumers rows).
long long tma_items(const Problem& problem, int consumers) {
  const int block_m = 64 * consumers;
  return static_cast<long long>((problem.max_q_len + block_m - 1) / block_m) * problem.heads_q * problem.batch;
}

// Plain scores (no softcap, no ALiBi) at the TMA kernel's full width: the
// calls its variant instantiations (the deep ring, few_items_consumers) take.
bool tma_plain_full_width(const Problem& problem) {
  return problem.softcap <= 0.0f && !problem.has_alibi &&
         sm90::tma_columns(problem.head_dim) == sm90::tma_head_dim(problem.head_dim);
}

// CUFLASH_TMA_MIN_KEYS=n overrides the tiles' min_keys (read once; for
// measuring the rules below).
int min_keys_override() {
  static const int value = env_int("CUFLASH_TMA_MIN_KEYS", -1);
  return value;
}

int tma_min_keys(const sm90::TmaFwdTile& tma) {
  return min_keys_override() >= 0 ? min_keys_override() : tma.min_keys;
}

// CUFLASH_TMA_CONSUMERS=n picks n consumer warpgroups wherever the tile
// has that count (its own or few_items_consumers, the latter with plain
// scores at full width), whatever the grid; other values are ignored (read
// once; for measuring the rules below).
int consumers_override() {
  static const int value = env_int("CUFLASH_TMA_CONSUMERS", 0);
  return value;
}

// Dense calls without a left window bound: the ones whose items the TMA
// kernel's CTAs can walk (tma_forward_launch adds the rest of the rule).
bool walkable_layout(const Problem& problem) {
  return problem.layout != Layout::varlen && problem.window_left < 0;
}

// The walk's rounds: items dealt one per SM at a time, the last round
// partly idle.
long long walk_rounds(long long items, const DeviceInfo& info) { return (items + info.sm_count - 1) / info.sm_count; }

// Causal items walk (in pairs of equal cost) below this many keys
// (tma_forward_launch, where the measurements are).
constexpr long long kWalkMaxKeys = 8192;

// The key-tile steps per SM of a dense causal call on `consumers` consumer
// warpgroups: each block of 64 x consumers rows steps over the key tiles
// up to its last row's diagonal (bottom-right), summed over the blocks of
// every (batch, head), over the SMs.
double causal_steps_per_sm(const Problem& problem, const sm90::TmaFwdTile& tma, int consumers,
                           const DeviceInfo& info) {
  const long long block_m = 64LL * consumers, q = problem.max_q_len, k = problem.max_kv_len;
  long long steps = 0;
  for (long long m0 = 0; m0 < q; m0 += block_m) {
    const long long keys = std::min(k, std::max(0LL, std::min(m0 + block_m, q) + k - q));
    steps += (keys + tma.block_n - 1) / tma.block_n;
  }
  return static_cast<double>(steps) * problem.heads_q * problem.batch / info.sm_count;
}

// Below this many key-tile steps per SM of the three-consumer grid, a dense
// causal call at D = 64 runs faster on two consumers walked in pairs
// (NOTES.md session 51, H200, B = 1-8 x 16 heads at 2048 and 4096 keys:
// the two-consumer walk's gain fell with the work per SM alike at both
// lengths: 12 steps +45 %, 24 +27 %, 47-49 +17-23 %, 93-98 +8-9 %, 186
// level, 372 -5 %; the sweep's 2048 keys, 196 steps, level in session 49).
constexpr double kCausalFewConsumersMaxSteps = 128.0;

// The consumer warpgroups the TMA kernel runs a problem with: the tile's,
// or its few_items_consumers (plain scores at full width, keys over more
// than one tile) where
// - that leaves at most one item per SM, or, in dense calls without a
//   window, the walk deals the fewer rows' items in no more rounds than
//   the tile's count: then each item is shorter and the rounds the same. Two
//   consumers at D = 64 compute a row at ~0.79 of three's rate (the SM's
//   tensor pipe waits on two softmax chains instead of three), so with
//   equal rounds they take ~0.84 of the time. Measured at D = 64 (H200,
//   NOTES.md session 51): B = 1 x 16 heads at 2048 keys +15 % and B = 2 at
//   1024 keys +12.5 % (two rounds either way), and where the rounds differ
//   (three against four) 0.87-0.90, as the rounds predict; at most one item
//   per SM (one round; session 31, B = 1, H = 16): 512 keys +9 % (none) /
//   +11 % (causal) over the cp.async kernel, and 128 keys, one key tile
//   with nothing for the producer to run ahead of, -7 % / -2 %;
// - the call is dense and causal (a right bound, no left one) below
//   min_keys, where the tile's own count loses to the cp.async kernel: its
//   items are then walked in pairs (tma_forward_launch). Measured at D = 64
//   on the sweep's causal shapes (H200, NOTES.md session 42): 512 / 1k keys
//   +4.8 / +7.6 % over the cp.async kernel (three consumers: -18 / -9 %;
//   at session 26 two consumers had lost too, before the walk and the
//   step's later changes); at 2k, where three consumers take over, level.
//   (Varlen and windowed calls, not walked, were not measured.)
// - or such a call from min_keys up to the walk's limit, on a grid of
//   fewer than kCausalFewConsumersMaxSteps key-tile steps per SM.
int tma_consumers(const Problem& problem, const sm90::TmaFwdTile& tma, const DeviceInfo& info) {
  const int forced = consumers_override();
  if (forced > 0 && forced == tma.few_items_consumers && tma_plain_full_width(problem)) return forced;
  if (forced > 0 && forced == tma.consumers) return forced;
  if (tma.few_items_consumers == 0 || !tma_plain_full_width(problem) || problem.max_kv_len <= tma.block_n)
    return tma.consumers;
  const long long fewer_rows_items = tma_items(problem, tma.few_items_consumers);
  // (Only where every item costs the same and is walked: varlen, windowed
  // and causal items in equal rounds were not measured.)
  const bool no_more_rounds =
      fewer_rows_items <= info.sm_count ||
      (walkable_layout(problem) && problem.window_right < 0 &&
       walk_rounds(fewer_rows_items, info) <= walk_rounds(tma_items(problem, tma.consumers), info));
  const bool dense_causal = walkable_layout(problem) && problem.window_right >= 0;
  const bool short_causal = dense_causal && problem.max_kv_len < tma_min_keys(tma);
  if (no_more_rounds || short_causal) return tma.few_items_consumers;
  // (Last: the steps are counted over the query blocks.)
  const bool light_causal = dense_causal && problem.max_kv_len < kWalkMaxKeys &&
                            causal_steps_per_sm(problem, tma, tma.consumers, info) < kCausalFewConsumersMaxSteps;
  return light_causal ? tma.few_items_consumers : tma.consumers;
}

// CUFLASH_TMA_SHORT_MAX_KEYS=n overrides the tiles' short_max_keys (read
// once; for measuring the rule).
int short_max_keys_override() {
  static const int value = env_int("CUFLASH_TMA_SHORT_MAX_KEYS", -1);
  return value;
}

// Whether the TMA kernel runs a problem with its tile's short_block_n key
// tiles: causal calls (a right bound) below short_max_keys, plain scores at
// the kernel's full width (the instantiations there are). D = 256: 64-key
// tiles below 1024 keys. Measured when the 80-key tiles came (H100,
// NOTES.md "TMA forward: 80-key tiles at D = 256"), 80 against 64 keys:
// 512 keys -3.2 % (none) / -4.5 % (causal), 1k +1.3 / +0.3 %, 4k +4.7 /
// +7.9 %; measured again with the rule (H200, session 43): causal 512
// +7.3 %, 1k +0.2 %, but without a mask 512 -0.5 %, so calls without a
// right bound keep the 80-key tiles.
bool tma_short_tiles(const Problem& problem, const sm90::TmaFwdTile& tma) {
  const int max_keys = short_max_keys_override() >= 0 ? short_max_keys_override() : tma.short_max_keys;
  return tma.short_block_n > 0 && problem.window_right >= 0 && problem.max_kv_len < max_keys &&
         tma_plain_full_width(problem);
}

// Whether the TMA kernel runs a problem with its tile's short_q_buffers Q
// buffers: calls under short_q_max_keys keys with plain scores at the
// kernel's full width, on the tile's own ring and key tiles (D = 128: three
// Q buffers below 2048 keys, where the deep ring is not taken).
bool tma_short_q_buffers(const Problem& problem, const sm90::TmaFwdTile& tma, bool other_variant) {
  return tma.short_q_buffers > 0 && !other_variant && problem.max_kv_len < tma.short_q_max_keys &&
         tma_plain_full_width(problem);
}

// CUFLASH_TMA_SPLIT_KEYS=0 / 1: never / wherever the kernel has it (read
// once; for measuring the rule below).
int split_keys_override() {
  static const int value = env_int("CUFLASH_TMA_SPLIT_KEYS", -1);
  return value;
}

// Whether the TMA kernel runs a problem on its split-keys kernel (two
// consumers on each block of 64 rows, splitting its key tiles): plain
// scores at full width on two consumers, where the blocks of 64 rows fit
// one wave and their keys span more than one of the tile's own key tiles
// (block_n), below the tile's split_keys_max_keys: there each CTA's chain
// of key tiles, not the SM's work, sets the call's time, and the split
// halves it. Measured at B = 1, H = 16 (H200): D = 64 (NOTES.md session
// 50; forced at 128 keys, one tile, 0.95-0.96) and D = 128 on its 64-key
// tiles (session 51: 256 / 512 keys +2.5 / +7.9 % unmasked, +1.5 / +7.7 %
// causal; at 128 keys, two such tiles, the sweep read 9.8 against the
// two-consumer kernel's 9.5 us the session before, so one 128-key tile
// stays on that kernel).
bool tma_split_keys(const Problem& problem, const sm90::TmaFwdTile& tma, int consumers, const DeviceInfo& info) {
  if (tma.split_keys_max_keys == 0 || consumers != 2 || !tma_plain_full_width(problem)) return false;
  if (split_keys_override() >= 0) return split_keys_override() == 1;
  return problem.max_kv_len > tma.block_n && problem.max_kv_len < tma.split_keys_max_keys &&
         tma_items(problem, 1) <= info.sm_count;
}

// Whether the TMA kernel of `tma` (a head dim it has), run with `consumers`,
// beats the cp.async one: from the tile's min_keys on, and with its
// few_items_consumers; below, with the tile's own count, only without a
// right bound and on a grid of at least one wave (with fewer items each
// CTA's own latency decides, and the cp.async kernel's smaller blocks, two
// per SM, won).
bool tma_wins(const Problem& problem, const sm90::TmaFwdTile& tma, int consumers, const DeviceInfo& info) {
  if (problem.max_kv_len >= tma_min_keys(tma) || consumers != tma.consumers) return true;
  return problem.window_right < 0 && tma_items(problem, tma.consumers) >= info.sm_count;
}

ForwardKernel forward_kernel(const Problem& problem, const DeviceInfo& info) {
  ForwardKernel k;
  k.tile = sm80::fwd_tile(sm80::kernel_head_dim(problem.head_dim));
#if defined(CUFLASH_WITH_SM90A)
  if (!info.valid || info.major != 9 || info.minor != 0 || !sm90_forward_enabled()) return k;
  // The Hopper kernels have no dropout mask: the mma.sync kernel (which runs
  // on sm90 too) takes those calls.
  if (problem.has_dropout()) return k;
  const sm90::TmaFwdTile tma = tma_fwd_tile_for(problem);
  const int consumers = tma.block_n > 0 ? tma_consumers(problem, tma, info) : 0;
  if (tma.block_n > 0 && sm90_tma_enabled() && tma_wins(problem, tma, consumers, info) &&
      tma_maps_fit(problem, info)) {
    k.kind = ForwardKind::tma;
    k.tma_split_keys = tma_split_keys(problem, tma, consumers, info);
    k.tma_short_tiles = tma_short_tiles(problem, tma);
    const int block_n = k.tma_split_keys    ? sm90::split_keys_block_n(tma)
                        : k.tma_short_tiles ? tma.short_block_n
                                            : tma.block_n;
    k.tile = {k.tma_split_keys ? 64 : 64 * consumers, block_n, 4 * (consumers + 1), false, 1};
    k.tma_consumers = consumers;
    return k;
  }
  // The cp.async wgmma kernel loads whole rows: the caller's head dim must be its own.
  const sm90::WgmmaFwdTile hopper = sm90::wgmma_fwd_tile(problem.head_dim);
  if (hopper.block_n > 0) {
    k.kind = ForwardKind::wgmma;
    k.tile = {128, hopper.block_n, 8, false, hopper.min_blocks};
  }
#endif
  return k;
}

// Whether the TMA kernel's CTAs walk the work items themselves (one per SM),
// so that the producer loads the next item's Q and K/V under the current
// item's last GEMMs and epilogue: dense calls without a left window bound,
// whose items cost the same or (causal, below kWalkMaxKeys) a known
// number of key tiles, which the walk deals out in pairs of equal cost
// (tile_order.hpp). Varlen, windowed and D = 192 items go to the hardware's
// block scheduler, one CTA per item, and D = 256's from kWalkMaxKeys keys.
// (D = 256, one Q buffer, walks since session 32: its Q is released before
// the epilogue, so the next item's loads run under it. D = 192 was not
// measured walked.)
// CUFLASH_TMA_PERSISTENT=1 walks every call's items that way, =0 none (read
// once; for measuring the rule).
int persistent_override() {
  static const int value = [] {
    const char* v = std::getenv("CUFLASH_TMA_PERSISTENT");
    return v == nullptr ? -1 : std::string(v) != "0";
  }();
  return value;
}

// CUFLASH_TMA_DEEP_MIN_KEYS=n overrides the tile's deep_min_keys (read
// once; for measuring the rule).
int deep_min_keys_override() {
  static const int value = env_int("CUFLASH_TMA_DEEP_MIN_KEYS", -1);
  return value;
}

// Causal items walk while they are short, on the two-consumer kernel: a long
// item's own prologue is a small part of it, and the walk's whole pairs
// leave a coarser tail than the hardware's heaviest-first grid (D=128: 16k
// keys 561 against 584 TFLOP/s per item, 512-2k keys 4-11 % faster
// walked); the three-consumer D=64 kernel gained nothing walked at any
// length and lost 8 % at 2k (NOTES.md, "causal items walked"). D = 256
// walks below it with or without a mask: +4-10 % at 512-1k, level at
// 2k-4k, but 0.97 of one CTA per item at 16k keys without one (NOTES.md,
// session 32). (kWalkMaxKeys: above, where tma_consumers reads it too.)

sm90::TmaForwardLaunch tma_forward_launch(const Problem& problem, const ForwardKernel& kernel, const DeviceInfo& info) {
  const int consumers = kernel.tma_consumers;
  sm90::TmaForwardLaunch launch;
  launch.q = sm90::head_rows_tensor(problem, problem.q, problem.heads_q);
  launch.k = sm90::head_rows_tensor(problem, problem.k, problem.heads_kv);
  launch.v = sm90::head_rows_tensor(problem, problem.v, problem.heads_kv);
  // A right bound alone (causal: 0) makes a block's cost grow with its rows.
  launch.causal_walk = problem.window_right >= 0;
  const sm90::TmaFwdTile tile = tma_fwd_tile_for(problem);
  launch.few_items = consumers != tile.consumers;
  launch.split_keys = kernel.tma_split_keys;
  launch.short_tiles = kernel.tma_short_tiles;
  const int kernel_dim = sm90::tma_head_dim(problem.head_dim);
  const bool short_keys = problem.max_kv_len < kWalkMaxKeys;
  const bool walkable = walkable_layout(problem) &&
                        (!launch.causal_walk || (short_keys && consumers == 2)) &&
                        (kernel_dim != 256 || short_keys) && kernel_dim != 192;
  // The deeper ring where the keys are long enough, for the kernels that
  // have one (plain scores, the kernel's full width). (It leaves D = 128 one
  // Q buffer, and the walk stays: measured so, NOTES.md session 22.)
  const int deep_min_keys = deep_min_keys_override() >= 0 ? deep_min_keys_override() : tile.deep_min_keys;
  launch.deep_ring = tile.deep_stages > 0 && problem.max_kv_len >= deep_min_keys && tma_plain_full_width(problem);
  launch.short_q_buffers = tma_short_q_buffers(
      problem, tile, launch.few_items || launch.short_tiles || launch.deep_ring || launch.split_keys);
  const int forced = persistent_override();
  if (forced == 0 || (forced < 0 && !walkable)) return launch;
  launch.persistent_ctas = info.sm_count;
  return launch;
}

// Split-KV when the grid would leave SMs idle: few (batch x head x query
// block) CTAs over long keys. A split costs a second launch (the combine) and
// fp32 partials of every query row written and read back, so it pays only
// when each split keeps a long run of key tiles: measured on the H100
// (docs/perf/NOTES.md, "Split-KV on small problems"), B=1 x 16 heads at 512
// and 1k keys ran 18-35 % faster unsplit, with one CTA per SM for at least
// half of the SMs already. Depends on shapes and the device only, so
// workspace queries agree.
constexpr long long kMinKeyTilesPerSplit = 8;
constexpr long long kMinKeyTilesToSplit = 2 * kMinKeyTilesPerSplit;
// Key tiles from which a grid that already gives half the SMs a CTA may
// still split (long keys: the partials are small next to the work).
constexpr long long kLongKeyTiles = 64;
// CUFLASH_FORWARD_SPLITS=n > 0 fixes the split count (read once; for
// measuring the rule; clamped like the rule's to what the keys allow).
int splits_override() {
  static const int value = env_int("CUFLASH_FORWARD_SPLITS", 0);
  return value;
}

int choose_splits(const Problem& problem, const ForwardKernel& kernel, const DeviceInfo& info) {
  const sm80::FwdTile tile = kernel.tile;
  if (!info.valid || tile.block_m == 0) return 1;
  const long long key_tiles = (problem.max_kv_len + tile.block_n - 1) / tile.block_n;
  if (splits_override() > 0)
    return static_cast<int>(std::clamp<long long>(splits_override(), 1, std::clamp<long long>(key_tiles, 1, kMaxSplits)));
  const long long m_blocks = (problem.max_q_len + tile.block_m - 1) / tile.block_m;
  const long long ctas = m_blocks * problem.heads_q * problem.batch;
  const long long slots = static_cast<long long>(info.sm_count) * tile.min_blocks;
  if (ctas * 2 > slots || key_tiles < kMinKeyTilesToSplit) return 1;
  if (ctas * 2 > info.sm_count && key_tiles < kLongKeyTiles) return 1;
  long long splits = (slots + ctas - 1) / ctas;
  splits = std::min<long long>({splits, key_tiles / kMinKeyTilesPerSplit, kMaxSplits});
  return static_cast<int>(std::max<long long>(splits, 1));
}

}  // namespace

ForwardPlan plan_forward(const Problem& problem, const DeviceInfo& device) {
  ForwardPlan plan;
  const ForwardKernel kernel = forward_kernel(problem, device);
  plan.kind = kernel.kind;
  plan.tile = kernel.tile;
  plan.splits = choose_splits(problem, kernel, device);
  if (plan.kind == ForwardKind::tma) {
    plan.tma = tma_forward_launch(problem, kernel, device);
    // O by TMA stores: dense rows (a varlen sequence's last block would
    // overwrite the next sequence's rows), unsplit (partials are fp32 rows
    // of their own), an output the map can describe (a workspace query may
    // come without one: its plan never launches).
    if (tma_store_enabled() && problem.layout != Layout::varlen && plan.splits == 1 && !problem.out.empty()) {
      plan.tma.out = sm90::head_rows_tensor(problem, problem.out, problem.heads_q);
      plan.tma.out_by_tma = sm90::tma_layout_ok(plan.tma.out);
    }
  }
  plan.workspace_bytes = split_partials_bytes(problem, plan.splits);
  return plan;
}

ForwardPlan plan_forward(const Problem& problem) { return plan_forward(problem, device_info(problem.device.index)); }

}  // namespace cuflash::detail
