// FlashAttention forward on Hopper, warp-specialized: TMA loads by a
// producer warp, wgmma by consumer warpgroups, mbarriers between them.
//
// A CTA is one producer warpgroup and `Consumers` consumer warpgroups of 64
// query rows each (BM = 64 x Consumers rows of one (batch, head); in the
// split-keys kernel two warpgroups on the same 64 rows, TmaFwdShape::
// kSplitKeys). One
// thread of the producer issues TMA loads: Q once, then K_j and V_j of every
// key tile into a ring of `Stages` shared-memory stages, each guarded by a
// "full" mbarrier (the TMA unit's bytes have landed) and an "empty" one
// (every consumer thread is done reading). The producer warpgroup gives its
// registers to the consumers (setmaxnreg), which hold S and O.
//
// Each consumer warpgroup runs the schedule of the cp.async wgmma kernel
// (flash_fwd_wgmma_kernel.cuh): iteration j issues S_j = Q K_j^T and
// O += P_{j-1} V_{j-1} together, computes P_j while P_{j-1} V_{j-1} runs,
// then rescales O. Across warpgroups the GEMM issues take turns (ping-pong,
// named barriers): consumer c issues its pair, then hands the turn to
// consumer c + 1, so one warpgroup's softmax runs while the other's GEMMs
// keep the tensor cores busy (not with split keys: there the two chains
// are independent). No __syncthreads after the prologue: a slow
// warpgroup never stalls the loads, only the stage it still reads.
#pragma once

#include <cuda.h>

#include <cmath>
#include <cstdint>

#include "common/attention_params.hpp"
#include "common/bool_switch.cuh"
#include "common/forward_block.cuh"
#include "common/score_mask.cuh"
#include "common/tensor_core.cuh"
#include "sm90/mbarrier.cuh"
#include "softmax_merge.hpp"
#include "sm90/step_timeline.cuh"
#include "sm90/stmatrix.cuh"
#include "sm90/sw128_tile.hpp"
#include "sm90/tile_order.hpp"
#include "sm90/tma_load.cuh"
#include "sm90/tma_store.cuh"
#include "sm90/warpgroup.cuh"
#include "sm90/wgmma.cuh"
#include "sm90/wgmma_wait_pin.cuh"
#include "sm90/work_item_slot.cuh"

namespace cuflash::detail::sm90 {

// What the kernel reads: the call's parameters and one TMA map per input.
struct TmaForwardParams {
  ForwardParams p;
  CUtensorMap q, k, v;
  // out_by_tma: O leaves through TMA stores of 64-row boxes (dense, unsplit
  // calls whose output can be mapped); else every consumer thread stores
  // row chunks of its staged rows itself.
  CUtensorMap out;
  bool out_by_tma = false;
  TileOrder order;  // the work items (query blocks of BM rows) and who takes which
  ForwardBlockDivisors divisors;  // of p: an item's batch, split and kv head
};

// D: the kernel's head dim (shared-memory tiles, TMA boxes); DC: the columns
// it computes (flash_fwd_wgmma_tiles.hpp, tma_columns), D or fewer for a
// narrower caller's head dim: Q K^T over DC / 16 k-steps, P V with N = DC.
// The columns past the caller's head dim are zeros (TMA's fill), so both
// only skip work on zeros.
// QBuffersWanted_: 0 for the rule below (kWantedQBuffers), else that many.
// SplitKeys_: the consumers share one block of 64 query rows and split its
// key tiles (kSplitKeys below).
template <typename T, int D_, int BN_, int Consumers_, int Stages_, int DC_, int QBuffersWanted_,
          bool SplitKeys_ = false>
struct TmaFwdShape {
  using Element = T;
  static constexpr int D = D_, BN = BN_, Consumers = Consumers_, Stages = Stages_, DC = DC_;
  static_assert(DC % 16 == 0 && DC <= D, "computed columns: whole k-steps of the kernel's head dim");
  // Split keys (grids of few 64-row items, forward_plan.cpp): the CTA's two
  // consumers compute the same 64 query rows, consumer c the item's key
  // tiles j with j % 2 == c, so that each chain is half the item's tiles;
  // consumer 1 hands its normalized O and lse to consumer 0 through shared
  // memory (the merge buffer), which merges them (softmax_merge.hpp) and
  // runs the epilogue. A stage is read by one consumer (kStageReaders), and
  // the two chains, independent, take no GEMM turns (kPingPong).
  static constexpr bool kSplitKeys = SplitKeys_;
  static_assert(!kSplitKeys || (Consumers == 2 && Stages % 2 == 0),
                "split keys: two consumers, each on every other stage of the ring");
  static constexpr int BM = kSplitKeys ? 64 : 64 * Consumers;
  // The key tiles between a consumer's consecutive ones, and the consumer
  // threads that read (and release) each K/V stage.
  static constexpr int kKeyStride = kSplitKeys ? Consumers : 1;
  static constexpr int kStageReaders = 128 * (kSplitKeys ? 1 : Consumers);
  static constexpr bool kPingPong = !kSplitKeys;
  static constexpr int kThreads = 128 * (Consumers + 1);
  // Registers per thread after the hand-over: 128 x (producer + consumers)
  // must fit the SM's 64 K.
  static constexpr int ProducerRegs = Consumers == 2 ? 24 : 32;
  static constexpr int ConsumerRegs = Consumers == 2 ? 240 : 160;
  static_assert(128 * (ProducerRegs + Consumers * ConsumerRegs) <= 65536);
  static constexpr int NT = BN / 8;   // n8 column blocks of S per warp
  static constexpr int DT = DC / 8;   // n8 column blocks of O per warp
  static constexpr int KQ = DC / 16;  // k-steps of Q K^T
  static constexpr int KP = BN / 16;  // k-steps of P V
  // An item's first key tile (its last keys) may be walked at half width
  // (ConsumerPipe::half_first): its upper BN / 2 keys are then whole k-steps.
  // Not with three consumers (D = 64's 160 registers): the second step's
  // code took its spills from 60 / 100 to 112 / 184 bytes and the calls
  // without a mask 1-2 % slower at 512-2k keys (NOTES.md, session 30).
  static constexpr bool kHalfFirst = BN % 32 == 0 && Consumers == 2;
  // The online softmax's two rows together (online_softmax_m16_rows_together,
  // the P V's wait held below half the exponentials) or row by row. Together
  // at D = 64, which the exponentials' issue bounds: +2-5 % from 512 keys
  // (H200, session 37); at D = 128 since the peel (kPeelFirst), after which
  // ptxas put the row-by-row form's P V wait before every exponential
  // (ncu: 6.8 % of the step's stall samples there): +2-4 % from 1k keys
  // (session 39). D = 256 keeps the row-by-row form (level, session 37).
  static constexpr bool kRowsTogether = D <= 128;
  // An item's first step peeled off the tile loop (its P V, V wait and
  // release, and rescale are absent), so that the loop's step has none of
  // the branches on j == 0: D = 64 / 128, plain scores only. (At
  // D = 256, and in the transformed kernels, the second copy of the step
  // doubled the spills: D = 256 156 / 228 -> 264 / 444 bytes.) Measured
  // (H200, session 38): D = 64 +1.2-2.7 % on the TMA kernel's points,
  // D = 128 0.995-1.024.
  static constexpr bool kPeelFirst = D <= 128;
  // The Q loads from a producer warp of their own (warp 1, idle before),
  // so that the next item's Q goes out as soon as its buffer is free
  // instead of after this item's K/V loads, each of which waits for a free
  // stage. Measured (H200, session 46, two A/B runs): D = 128 causal and
  // D = 256 +1-2 % at most points, D = 128 unmasked level; D = 64 -0.5 %
  // at most points (its consumers' waits are for the item's last V, at
  // the drain: ncu), so D = 64 keeps one producer warp. (K and V each from
  // a warp of its own lost 2-7 % at D = 64.)
  static constexpr bool kQWarp = D >= 128;
  using QTile = Sw128Tile<BM, D>;
  using KVTile = Sw128Tile<BN, D>;
  static constexpr int kStageBytes = 2 * KVTile::kBytes;  // K, then V
  // Q buffers: with two, the producer loads the next work item's Q while the
  // consumers still stage this item's O in their own (the epilogue), so a
  // short item (few key tiles) does not wait for its Q; one where two do not
  // fit in shared memory (D = 256, D = 128's deep ring); three below.
  // The layout for a number of Q buffers: Q buffers, the K/V stages, the
  // barriers (q_full[q], q_empty[q], k/v_full, k/v_empty, v_landed), one
  // work-item slot per Q buffer (16-byte aligned), and 1 KiB of slack to
  // align the base to a swizzle atom.
  static constexpr int barriers_with(int q_buffers) { return 2 * q_buffers + 1 + 4 * Stages; }
  static constexpr int barrier_offset_with(int q_buffers) { return q_buffers * QTile::kBytes + Stages * kStageBytes; }
  static constexpr int slot_offset_with(int q_buffers) {
    return (barrier_offset_with(q_buffers) + 8 * barriers_with(q_buffers) + 15) / 16 * 16;
  }
  // The merge buffer (kSplitKeys): per consumer thread, its O fragment and
  // two lse, stored register-major ([value][thread]: conflict-free).
  static constexpr int kMergeValues = DC / 8 * 4 + 2;
  static constexpr int kMergeBytes = kSplitKeys ? kMergeValues * 128 * 4 : 0;
  static constexpr int merge_offset_with(int q_buffers) {
    return (slot_offset_with(q_buffers) + q_buffers * int(sizeof(WorkItemSlot)) + 15) / 16 * 16;
  }
  static constexpr int smem_bytes_with(int q_buffers) {
    return (kSplitKeys ? merge_offset_with(q_buffers) + kMergeBytes
                       : slot_offset_with(q_buffers) + q_buffers * int(sizeof(WorkItemSlot))) +
           1024;
  }
  // Three at D = 64 with two consumers (its short causal walks and grids of
  // few items: items of 1-4 key tiles, whose consumers waited for the next
  // Q most of all, ncu session 43): with three Q buffers the producer
  // issues it two items ahead. Measured on the H200 (session 43, over the
  // four-stage ring): causal 512 / 1k keys +2.0 / +0.3 %; elsewhere a third
  // Q buffer lost (D = 64's three consumers -1-2 %, D = 128 from 4k keys
  // -1 %), so only this kernel has it.
  // D = 128 takes three in its calls of short keys through TmaFwdConfigQ
  // (TmaFwdTile::short_q_buffers).
  static constexpr int kWantedQBuffers = QBuffersWanted_ > 0             ? QBuffersWanted_
                                         : D == 64 && Consumers == 2 ? 3
                                                                     : 2;
  static constexpr int QBuffers = smem_bytes_with(kWantedQBuffers) <= 227 * 1024 ? kWantedQBuffers
                                  : smem_bytes_with(2) <= 227 * 1024         ? 2
                                                                             : 1;
  // With one Q buffer, an item's Q is released once its last Q K^T has been
  // read (after its last step), so that the next item's Q and first K/V
  // load under this item's drain and epilogue; O is then staged for its
  // stores in the item's last K/V stage instead (each consumer's 64 rows in
  // one of its tiles), which the steps release only after the stores.
  static constexpr bool kEarlyQRelease = QBuffers == 1;
  static_assert(!kEarlyQRelease || (Consumers == 2 && BN >= 64),
                "O staged in a stage: K for one consumer, V for the other");
  static constexpr int kStagesOffset = QBuffers * QTile::kBytes;
  static constexpr int kBarrierOffset = barrier_offset_with(QBuffers);
  static constexpr int kBarriers = barriers_with(QBuffers);
  static constexpr int kSlotOffset = slot_offset_with(QBuffers);
  static constexpr int kMergeOffset = merge_offset_with(QBuffers);
  static constexpr int kSmemBytes = smem_bytes_with(QBuffers);
  static_assert(BN % 16 == 0 && BN <= 256, "S is one wgmma of N = BN; P V takes whole k-steps of 16 keys");
  static_assert(BM <= 256 && BN <= 256, "one TMA box per 64-column block");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per SM");
  // Named barriers 1 .. Consumers: consumer c may issue its GEMMs;
  // Consumers + 1 + c: consumer c's O is staged for its TMA store.
  static constexpr int kTurnBarrier0 = 1;
  static constexpr int kStagedBarrier0 = kTurnBarrier0 + Consumers;
  // kEarlyQRelease: consumer 1 has read the item's last K tile (its last S
  // waited for), consumer 0 its last V tile (its drain), so that the other
  // may stage O there.
  static constexpr int kKReadBarrier = kStagedBarrier0 + Consumers;
  static constexpr int kVReadBarrier = kKReadBarrier + 1;
  // kSplitKeys: consumer 1's O is in the merge buffer (kMergeFull), and
  // consumer 0 has read it (kMergeFree).
  static constexpr int kMergeFull = kVReadBarrier + 1;
  static constexpr int kMergeFree = kMergeFull + 1;
  static_assert(kMergeFree < 16, "named barriers");
};

// The kernels' configs: structs rather than aliases of TmaFwdShape, so that
// a kernel's (mangled) name says which: TmaFwdConfig with the rule's Q
// buffers, TmaFwdConfigQ with a chosen count, TmaFwdConfigSplitKeys two
// consumers splitting a 64-row block's key tiles.
template <typename T, int D, int BN, int Consumers, int Stages, int DC = D>
struct TmaFwdConfig : TmaFwdShape<T, D, BN, Consumers, Stages, DC, 0> {};
template <typename T, int D, int BN, int Consumers, int Stages, int QBuffers, int DC = D>
struct TmaFwdConfigQ : TmaFwdShape<T, D, BN, Consumers, Stages, DC, QBuffers> {};
template <typename T, int D, int BN, int Stages, int DC = D>
struct TmaFwdConfigSplitKeys : TmaFwdShape<T, D, BN, 2, Stages, DC, 0, true> {};

// A consumer warpgroup's pipeline over the key tiles of its items. Key tile
// j's step issues S_j = Q K_j^T together with the pending P V (the previous
// tile's), computes P_j while the P V runs, then folds that P V into O; an
// item's last P V is issued alone (drain) before its epilogue. (Issuing
// that last P V with the next item's first Q K^T and running the epilogue
// under it was tried twice: 5-13 % slower at 512-2k keys, NOTES.md
// "consecutive items", and 5-11 % with TMA stores, "the carried P V": the
// epilogue then sits on the consumer's own chain.) An item's first P V
// overwrites O (wgmma without accumulation), so O needs no zeros between
// items.
// Which key tiles of an item a ConsumerPipe::step call may be: any (its
// pending P V decided by j > 0), the first (none pending) or a later one.
enum class StepTile { any, first, later };

template <class C>
struct ConsumerPipe {
  using T = typename C::Element;
  std::uint64_t *k_full, *v_full, *k_empty, *v_empty;
  int my_turn, next_turn;
  // Stage 0's K and V descriptors, computed once: built inside a step, the
  // descriptor arithmetic landed between the turn's barrier and the first
  // wgmma, on the hand-over's critical path.
  std::uint64_t k_desc, v_desc;
  std::uint32_t kv_count = 0;  // the ring's count of this consumer's next key tile (its stage and phase)
  std::uint32_t item_tile0 = 0;  // kSplitKeys: the ring's count of the item's first key tile
  // The pending P V is a half-width tile's (its upper k-steps' P are not
  // computed: they are zeros).
  bool pv_half = false;

  __device__ __forceinline__ ConsumerPipe(unsigned char* stage0_, std::uint64_t* k_full_, std::uint64_t* v_full_,
                                          std::uint64_t* k_empty_, std::uint64_t* v_empty_, int my_turn_,
                                          int next_turn_)
      : k_full(k_full_), v_full(v_full_), k_empty(k_empty_), v_empty(v_empty_), my_turn(my_turn_),
        next_turn(next_turn_), k_desc(sw128_desc(stage0_, 16, 1024)),
        v_desc(sw128_desc(stage0_ + C::KVTile::kBytes, C::KVTile::kBlockBytes, 1024)) {}

  // The GEMM turn (C::kPingPong): taken before a warpgroup's issue, passed
  // on after it.
  __device__ __forceinline__ void take_turn() const {
    if constexpr (C::kPingPong) named_barrier_sync(my_turn, 256);
  }
  __device__ __forceinline__ void pass_turn() const {
    if constexpr (C::kPingPong) named_barrier_arrive(next_turn, 256);
  }
  // kSplitKeys: an item's key tiles for consumer `consumer` start at its
  // index (every kKeyStride-th from there); the item's end moves the ring's
  // count past all n_tiles of them, both consumers'.
  __device__ __forceinline__ void begin_split_item(int consumer) { kv_count = item_tile0 + consumer; }
  __device__ __forceinline__ void end_split_item(int n_tiles) { item_tile0 += n_tiles; }

  // O (+)= P V of the tile in `stage` over its first KP k-steps; the item's
  // first overwrites O.
  template <int KP>
  __device__ __forceinline__ void issue_pv_steps(float (&o)[C::DT][4], const std::uint32_t (&pa)[C::KP][4], int stage,
                                                 bool first) const {
    // The stage's descriptor once, the steps as immediates on it: ptxas does
    // not split (stage * bytes + step) >> 4 itself, and rebuilt it per wgmma.
    const std::uint64_t v_stage = desc_advance(v_desc, stage * C::kStageBytes);
#pragma unroll
    for (int kk = 0; kk < KP; ++kk)
      wgmma_rs<T, C::DC, true>(o, pa[kk], desc_advance(v_stage, C::KVTile::mn_major_step_bytes(kk)),
                               kk > 0 || !first);
    wgmma_commit();
  }
  // The pending P V, at the width its tile was walked.
  __device__ __forceinline__ void issue_pv(float (&o)[C::DT][4], const std::uint32_t (&pa)[C::KP][4], int stage,
                                           bool first) {
    if constexpr (C::kHalfFirst) {
      if (pv_half) {
        pv_half = false;
        issue_pv_steps<C::KP / 2>(o, pa, stage, first);
        return;
      }
    }
    issue_pv_steps<C::KP>(o, pa, stage, first);
  }

  // Whether an item's first key tile (keys [n0, n0 + BN)) is walked at half
  // width by this warpgroup: where none of its rows (rows0 .. rows0 + 63 of
  // the block) sees the tile's upper half (the causal diagonal's tile for
  // the first 64 rows of a 128-row block), S and the exponentials cover the
  // lower half and P V its k-steps: a quarter of the diagonal tile's GEMM
  // work of the block.
  __device__ __forceinline__ static bool half_first(const ForwardBlock& f, int rows0, int n0) {
    if constexpr (C::kHalfFirst)
      return f.rules.tile_hidden(f.m0 + rows0, 64, n0 + C::BN / 2, C::BN / 2);
    else
      return false;
  }

  // Key tile j (within the item, the kv_count-th of the CTA) of the item
  // whose Q (this warpgroup's rows) q_desc describes: S_j, the pending P V
  // (tile j - 1's, A operand pa), the online softmax, P_j into pa, O
  // rescaled. row: the query row of this thread's first accumulator row
  // (within the sequence); t4: its column quad. last: the item's last tile,
  // whose K stays taken with one Q buffer (O is staged there).
  // NS: the n8 column blocks of S walked (C::NT, or C::NT / 2 for a
  // half-width first tile, half_first). Tile: which tiles the call may be
  // (StepTile), so that a peeled loop's steps carry no branch on j == 0.
  // Unmasked: the caller knows the tile needs no mask (unmasked_steps_down),
  // so the step does not test it: the test's ~25 uniform instructions sat
  // between S's wait and the row max, on the step's chain.
  template <bool Transformed, StepTile Tile = StepTile::any, int NS = C::NT, bool Unmasked = false>
  __device__ __forceinline__ void step(const ForwardBlock& f, std::uint64_t q_desc, int j, float (&o)[C::DT][4],
                                       std::uint32_t (&pa)[C::KP][4], float (&row_max)[2], float (&row_sum)[2],
                                       float mult, int row, int t4, bool last) {
    static_assert(NS == C::NT || NS * 2 == C::NT);
    // u: this warpgroup's own count of the item's tiles (j itself unless the
    // consumers split the keys); its pending P V is its previous tile's.
    const int u = j / C::kKeyStride;
    const bool pending = Tile == StepTile::any ? u > 0 : Tile == StepTile::later;
    const int n0 = (f.t_hi - 1 - j) * C::BN;
    const std::uint32_t t = kv_count;
    const int st = t % C::Stages, prev = (t + C::Stages - C::kKeyStride) % C::Stages;
    const unsigned long long wait_from = CUFLASH_TIMELINE_CLOCK();
    mbarrier_wait(&k_full[st], (t / C::Stages) & 1);
    if (pending) mbarrier_wait(&v_full[prev], ((t - C::kKeyStride) / C::Stages) & 1);
    CUFLASH_TIMELINE_WAITED(kTlWaitStep, wait_from, t);
    CUFLASH_TIMELINE(kTlLoads);

    float s[NS][4];
    const std::uint64_t k_stage = desc_advance(k_desc, st * C::kStageBytes);  // (as in issue_pv)
    take_turn();
    CUFLASH_TIMELINE(kTlTurn);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < C::KQ; ++ks)
      wgmma_ss<T, NS * 8>(s, desc_advance(q_desc, C::QTile::k_major_step_bytes(ks)),
                          desc_advance(k_stage, C::KVTile::k_major_step_bytes(ks)), ks > 0);
    wgmma_commit();
    // (The hand-over sits in each branch: one shared copy after the branch
    // made ptxas serialize the wgmmas.)
    if (pending) {
      issue_pv(o, pa, prev, u == 1);
      pass_turn();
      wgmma_wait<1>();
    } else {
      pass_turn();
      wgmma_wait<0>();
    }
    fence_accumulators(s);
    CUFLASH_TIMELINE(kTlS);
    if (!(C::kEarlyQRelease && last)) mbarrier_arrive(&k_empty[st]);  // K_j read

    float correction[2] = {1.0f, 1.0f};
    const bool masked = !Unmasked && !f.rules.tile_unmasked(f.m0, f.rows, n0, NS * 8);
    // kRowsTogether: both rows' chains interleaved, with a floor for the
    // P V's wait after half of the exponentials (wgmma_wait_pin.cuh):
    // without it ptxas hoists the wait below to the top of the block after
    // the mask's branch, and none of the exponentials would run under the
    // P V.
    if constexpr (C::kRowsTogether)
      online_softmax_m16_rows_together<NS, Transformed, RunningMax::lagging>(
          s, row_max, row_sum, correction, f.rules, row, n0, masked, t4, mult,
          [&](const float (&partial_sums)[2]) { wgmma_wait_floor(partial_sums, f.rules.scale_log2, k_full); });
    else
      online_softmax_m16<NS, Transformed, RunningMax::lagging>(s, row_max, row_sum, correction, f.rules, row, n0,
                                                               masked, t4, mult);
    CUFLASH_TIMELINE(kTlSoftmax);
    // The pending P V done: its V stage, its A registers and O are free.
    wgmma_wait<0>();
    fence_accumulators(o);
    if (pending) mbarrier_arrive(&v_empty[prev]);
    p_fragments_m16<T, NS / 2>(s, reinterpret_cast<std::uint32_t(&)[NS / 2][4]>(pa));
    if constexpr (NS != C::NT) pv_half = true;
    if (pending) rescale_moved_rows_m16<C::DT>(o, correction);  // (at j = 0 O holds no P V yet)
    kv_count += C::kKeyStride;
    CUFLASH_TIMELINE(kTlStep);
  }

  // The n_tiles key tiles of an item in which this warpgroup has no rows
  // (all past the sequence): no GEMM and no softmax, only what step() does
  // for the ring, in its order: each tile's loads waited for (so that the
  // releases count toward this use of the stage, not the one before), the
  // GEMM turn taken and handed on, K and the pending V released. (The
  // counter moves once, after the loop: moved per tile, ptxas took it out
  // of the uniform registers for the whole kernel.)
  __device__ __forceinline__ void pass_steps(int n_tiles) {
    for (int j = 0; j < n_tiles; ++j) {
      const std::uint32_t t = kv_count + j;
      const int st = t % C::Stages, prev = (t + C::Stages - 1) % C::Stages;
      mbarrier_wait(&k_full[st], (t / C::Stages) & 1);
      if (j > 0) mbarrier_wait(&v_full[prev], ((t - 1) / C::Stages) & 1);
      take_turn();
      pass_turn();
      if (!(C::kEarlyQRelease && j == n_tiles - 1)) mbarrier_arrive(&k_empty[st]);
      if (j > 0) mbarrier_arrive(&v_empty[prev]);
    }
    kv_count += n_tiles;
  }
  // drain() for such an item.
  __device__ __forceinline__ int pass_drain() {
    const std::uint32_t t = kv_count - 1;
    const int last = t % C::Stages;
    mbarrier_wait(&v_full[last], (t / C::Stages) & 1);
    take_turn();
    pass_turn();
    if constexpr (!C::kEarlyQRelease) mbarrier_arrive(&v_empty[last]);
    return last;
  }

  // The pending P V (of the n_tiles-th tile this warpgroup walked in the
  // item) alone, with no S to pair it with, landed in o. Returns that tile's
  // stage, whose V stays taken with one Q buffer (O is staged there).
  __device__ __forceinline__ int drain(float (&o)[C::DT][4], const std::uint32_t (&pa)[C::KP][4], int n_tiles) {
    const std::uint32_t t = kv_count - C::kKeyStride;
    const int last = t % C::Stages;
    const unsigned long long wait_from = CUFLASH_TIMELINE_CLOCK();
    mbarrier_wait(&v_full[last], (t / C::Stages) & 1);
    CUFLASH_TIMELINE_WAITED(kTlWaitDrain, wait_from, t);
    take_turn();
    CUFLASH_TIMELINE(kTlDrainTurn);
    wgmma_fence();
    issue_pv(o, pa, last, n_tiles == 1);
    pass_turn();
    wgmma_wait<0>();
    fence_accumulators(o);
    CUFLASH_TIMELINE(kTlDrain);
    if constexpr (!C::kEarlyQRelease) mbarrier_arrive(&v_empty[last]);
    return last;
  }
};

// Persistent: gridDim.x CTAs (at most one per SM) walk the work items of
// the (m_blocks, heads, batch x splits) grid in tile_order.hpp's order. The
// producer runs ahead into the next item while the consumers finish the
// current one (its last GEMMs, the epilogue).
template <class C, bool Transformed>
__global__ void __launch_bounds__(C::kThreads, 1) flash_fwd_tma_kernel(const __grid_constant__ TmaForwardParams tp) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename C::Element;
  using sm80::pack2;
  const ForwardParams& p = tp.p;
  extern __shared__ unsigned char smem_raw[];
  // wgmma's and TMA's swizzle is a function of the address: atoms must be
  // 1 KiB aligned.
  unsigned char* smem_base = smem_raw + ((1024 - (smem_address(smem_raw) & 1023)) & 1023);
  // Q buffer of the n-th work item this CTA takes, and the parity of its
  // barriers' phase for that item.
  auto sQ = [&](std::uint32_t n) { return reinterpret_cast<T*>(smem_base + (n % C::QBuffers) * C::QTile::kBytes); };
  auto q_phase = [](std::uint32_t n) { return (n / C::QBuffers) & 1; };
  unsigned char* stage0 = smem_base + C::kStagesOffset;
  auto sK = [&](int st) { return reinterpret_cast<T*>(stage0 + st * C::kStageBytes); };
  auto sV = [&](int st) { return reinterpret_cast<T*>(stage0 + st * C::kStageBytes + C::KVTile::kBytes); };
  std::uint64_t* q_full = reinterpret_cast<std::uint64_t*>(smem_base + C::kBarrierOffset);
  std::uint64_t* q_empty = q_full + C::QBuffers;
  std::uint64_t* k_full = q_empty + C::QBuffers;
  std::uint64_t* v_full = k_full + C::Stages;
  std::uint64_t* k_empty = v_full + C::Stages;
  std::uint64_t* v_empty = k_empty + C::Stages;
  std::uint64_t* v_landed = v_empty + C::Stages;  // a varlen tail's V, before its zeroing
  // The item whose Q a buffer holds (or the walk's end), from the producer.
  WorkItemSlot* slots = reinterpret_cast<WorkItemSlot*>(smem_base + C::kSlotOffset);

  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
#pragma unroll
    for (int qb = 0; qb < C::QBuffers; ++qb) {
      mbarrier_init(&q_full[qb], 1);
      mbarrier_init(&q_empty[qb], 128 * C::Consumers);
    }
    mbarrier_init(v_landed, 1);
#pragma unroll
    for (int st = 0; st < C::Stages; ++st) {
      mbarrier_init(&k_full[st], 1);
      mbarrier_init(&v_full[st], 1);
      mbarrier_init(&k_empty[st], C::kStageReaders);
      mbarrier_init(&v_empty[st], C::kStageReaders);
    }
    mbarrier_init_fence();
  }
  CUFLASH_TIMELINE_INIT();
  __syncthreads();
  CUFLASH_TIMELINE(kTlStart);

  // Varlen tensors are mapped as one batch of packed rows.
  const bool varlen = p.cu_seqlens_q != nullptr;

  if (wg == 0) {
    // Producer: lane 0 of warp 0 issues every K/V load and, in varlen
    // calls, the rest of warp 0 helps with the tails; the Q loads, and with
    // them each item's hand-over to the consumers, come from the same lane
    // or, with C::kQWarp, from lane 0 of warp 1, which walks the same items;
    // the other threads only give their registers back.
    //
    // A lane with nothing to do leaves instead of walking along: the lanes
    // of a diverged warp run their paths in turns, and lanes 1-31, which
    // have no waits of their own in a dense call, ran the CTA's whole walk
    // in one turn while lane 0 waited to issue its next load, once per
    // launch, ~1,000 clocks per item of the walk (D = 64 causal, 512 keys:
    // every CTA's consumers stopped ~11 us at B = 32 and ~28 us at B = 64:
    // NOTES.md, session 48). Varlen's tail helpers still run ahead, but only
    // to the next tail's wait, and varlen items go to the per-item grid.
    // (A __syncwarp per item to hold them changed ptxas's schedule of the
    // D = 64 three-consumer kernel's consumers: SASS.)
    warpgroup_registers_decrease<C::ProducerRegs>();
    const bool leader = tid == 0, q_loader = tid == (C::kQWarp ? 32 : 0);
    const bool tail_helper = varlen && tid < 32;
    if (!leader && !q_loader && !tail_helper) return;
    if (leader) {
      tma_prefetch_map(&tp.q);
      tma_prefetch_map(&tp.k);
      tma_prefetch_map(&tp.v);
      if (tp.out_by_tma) tma_prefetch_map(&tp.out);
    }
    std::uint32_t items = 0, kv_count = 0, tails = 0;
    // The CTA's n-th work item; the producer alone walks them, and hands
    // each to the consumers through its Q buffer's slot.
    for (int n = 0;; ++n) {
      const TileOrder::Item it = tp.order.item(n, blockIdx.x, gridDim.x);
      if (!it.more) break;
      if (!it.exists) continue;
      const ForwardBlock f = forward_block_at<C::BM, C::BN>(p, tp.divisors, tp.order.m_blocks, it.x, it.y, it.z);
      if (!f.active) continue;
      const int batch_coord = varlen ? 0 : f.b;
      if (q_loader) {
        // Q waits until the consumers have finished the epilogue of the
        // item that last used its buffer (which stages O there).
        const int qb = items % C::QBuffers;
        mbarrier_wait(&q_empty[qb], q_phase(items) ^ 1);
        slots[qb].publish(f);
        mbarrier_arrive_expect_tx(&q_full[qb], C::QTile::kBytes);
#pragma unroll
        for (int c = 0; c < C::QTile::kBlocks; ++c)
          tma_load_4d(sQ(items) + c * (C::QTile::kBlockBytes / 2), &tp.q, &q_full[qb], c * 64,
                      f.seq.q_start + f.m0, f.h, batch_coord);
        CUFLASH_TIMELINE(kTlLoadQ);  // (stamped where warp 0 loads Q: step_timeline.cuh)
      }
      if (C::kQWarp && tid >= 32) {  // the Q warp walks no key tiles
        ++items;
        continue;
      }
      const int n_tiles = max(f.t_hi - f.t_lo, 0);
      for (int j = 0; j < n_tiles; ++j, ++kv_count) {
        const int st = kv_count % C::Stages;
        const std::uint32_t phase = (kv_count / C::Stages) & 1;
        const int tile_key0 = (f.t_hi - 1 - j) * C::BN;  // within the sequence
        const int key0 = f.seq.k_start + tile_key0;
        // A varlen tile that runs past the sequence's keys reads the next
        // sequence's rows (or rows no sequence owns): their scores are
        // masked, but P = 0 times a non-finite V is NaN, so those V rows
        // are zeroed before the consumers see the tile. (Dense tensors end
        // at the sequence: TMA fills the rows past it with zeros.)
        const int tail_row = f.seq.k_len - tile_key0;
        const bool tail = varlen && tail_row < C::BN;
        if (leader) {
          CUFLASH_TIMELINE(kTlKWait);
          mbarrier_wait(&k_empty[st], phase ^ 1);
          CUFLASH_TIMELINE(kTlKFree);
          mbarrier_arrive_expect_tx(&k_full[st], C::KVTile::kBytes);
          CUFLASH_TIMELINE(kTlKArmed);
#pragma unroll
          for (int c = 0; c < C::KVTile::kBlocks; ++c)
            tma_load_4d(sK(st) + c * (C::KVTile::kBlockBytes / 2), &tp.k, &k_full[st], c * 64, key0, f.hk,
                        batch_coord);
          CUFLASH_TIMELINE(kTlLoadK);
          mbarrier_wait(&v_empty[st], phase ^ 1);
          std::uint64_t* v_bar = tail ? v_landed : &v_full[st];
          mbarrier_arrive_expect_tx(v_bar, C::KVTile::kBytes);
#pragma unroll
          for (int c = 0; c < C::KVTile::kBlocks; ++c)
            tma_load_4d(sV(st) + c * (C::KVTile::kBlockBytes / 2), &tp.v, v_bar, c * 64, key0, f.hk, batch_coord);
          CUFLASH_TIMELINE(kTlLoadV);
        }
        if (tail) {
          mbarrier_wait(v_landed, tails & 1);
          ++tails;
          C::KVTile::zero_rows_from(sV(st), tail_row, tid);
          // The zeros are generic-proxy writes that wgmma reads through the
          // async proxy; then the warp's writes before lane 0's arrival.
          fence_proxy_async_shared();
          __syncwarp();
          if (leader) mbarrier_arrive(&v_full[st]);
        }
      }
      ++items;
    }
    if (q_loader) {
      const int qb = items % C::QBuffers;
      mbarrier_wait(&q_empty[qb], q_phase(items) ^ 1);
      slots[qb].publish_end();
      mbarrier_arrive(&q_full[qb]);
    }
    CUFLASH_TIMELINE(kTlEnd);
    return;
  }

  warpgroup_registers_increase<C::ConsumerRegs>();
  // Consumer index: rows [64 cw, 64 cw + 64) of a block. Broadcast from
  // lane 0 so that the compiler knows it is warp-uniform: the Q descriptor
  // built from it then lives in uniform registers, and the per-k-step
  // descriptor arithmetic no longer borrows S's registers (which forced all
  // of it between the turn's barrier and the first wgmma).
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;
  const int warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int rows0 = C::kSplitKeys ? 0 : cw * 64;  // this warpgroup's first row within the block
  const int warp_row0 = rows0 + warp * 16;
  // Turn-taking: consumer c waits on barrier c, then passes to c + 1 (mod
  // Consumers). The last consumer opens consumer 0's first turn here, and
  // consumer 0 takes the last consumer's final hand-over at the end, so
  // every arrival has its sync.
  const int my_turn = C::kTurnBarrier0 + cw, next_turn = C::kTurnBarrier0 + (cw + 1) % C::Consumers;
  if (C::kPingPong && cw == C::Consumers - 1) named_barrier_arrive(C::kTurnBarrier0, 256);

  // Where a consumer stages its O for the stores: its 64 rows of the item's
  // Q buffer (every Q K^T that read them has completed), or with one Q
  // buffer (kEarlyQRelease: Q is released before the epilogue) a 64-row
  // tile in the item's last K/V stage, consumer 0's in its K tile and
  // consumer 1's in its V tile, whose releases the steps withhold until the
  // stores have read them. Both swizzled as Q was: the fragment writes are
  // free of bank conflicts and each 64-column block is a TMA box.
  using OTile = Sw128Tile<64, C::D>;  // a consumer's tile in a K/V stage

  // With TMA stores, thread 0 of each consumer issues its warpgroup's
  // stores, and the warpgroup releases their Q buffer once they have read
  // it, after the next item's first step (by then the read is long done,
  // so thread 0 does not hold its warp); a K/V stage at once (the
  // producer's next loads wait for it). Every thread of the warpgroup
  // takes part (the other threads have no stores to wait for), so that no
  // branch of one thread sits between the wgmmas (ptxas then serializes
  // them, C7520). stored_q: the Q buffer the last stores read, or -1.
  const bool store_leader = tid % 128 == 0;
  int stored_q = -1;
  auto release_stored_q = [&] {
    if (stored_q >= 0) {
      bulk_wait_group_read<0>();
      mbarrier_arrive(&q_empty[stored_q]);
      stored_q = -1;
    }
  };
  auto release_stage = [&](int st) {
    mbarrier_arrive(&k_empty[st]);
    mbarrier_arrive(&v_empty[st]);
  };

  // Epilogue of an item (its Q buffer: the q_item-th taken; with one Q
  // buffer its last K/V stage `last_stage`, or -1 for an item without key
  // tiles): normalize, write out (or the split's partial) and lse; then
  // the Q buffer (with one, already released unless the item was empty) or
  // the stage is free. An empty item (no visible key) comes with O zeroed,
  // row_sum 0 and row_max -inf: O = 0 and lse = -inf.
  const int row_in_block = warp_row0 + g;  // this thread's first accumulator row
  // write_rows: the same from the rows' 1 / sum and lse (row_totals_m16).
  auto write_rows = [&](const ForwardBlock& f, std::uint32_t q_item, const float (&o)[C::DT][4],
                        const float (&inv_sum)[2], const float (&lse)[2], int last_stage) {
    const int qb = q_item % C::QBuffers;
    // The lse is written after O's stores are issued: written before, its
    // global stores sat in front of the fence that makes the staged O
    // visible to the TMA unit (MEMBAR.ALL.CTA waits for them).
    const bool stage_in_kv = C::kEarlyQRelease && last_stage >= 0;
    if (p.num_splits > 1 || (C::kEarlyQRelease && !stage_in_kv)) {
      // Split partials are fp32 rows of their own; an empty item of a
      // one-Q-buffer kernel has no stage to write through (rare: zeros).
      if (p.num_splits > 1)
        write_partial_m16<C::DC>(p, f, o, inv_sum, f.m0 + row_in_block, t4);
      else
        write_out_m16<T, C::DC>(p, f, o, inv_sum, f.m0 + row_in_block, t4);
      write_lse_m16(p, f, lse, f.m0 + row_in_block, t4);
      if (stage_in_kv) release_stage(last_stage);
      else mbarrier_arrive(&q_empty[qb]);
      return;
    }
    // (Past the branch above a one-Q-buffer kernel always has its stage.)
    T* staging;
    if constexpr (C::kEarlyQRelease) {
      // The other consumer's reads of this tile done: its last S (K) or its
      // drain (V), each signalled after its wait.
      named_barrier_sync(cw == 0 ? C::kKReadBarrier : C::kVReadBarrier, 256);
      staging = reinterpret_cast<T*>(stage0 + last_stage * C::kStageBytes + cw * C::KVTile::kBytes);
    } else {
      staging = sQ(q_item);
    }
    // 16-byte chunk `chunk` of block row `row` (this consumer's: 64 cw ..),
    // and the box of 64-column block c. (The Q buffer's in the expressions
    // the kernel had before the stage's, so that the two-buffer kernels'
    // code stayed as it was: a reworded form cost D = 64's three-consumer
    // kernel 40 / 72 more bytes of spills.)
    auto staged = [&](int row, int chunk) {
      if constexpr (C::kEarlyQRelease)
        return staging + OTile::offset(row & 63, chunk);
      else
        return staging + C::QTile::offset(row, chunk);
    };
    auto staged_box = [&](int c) {
      if constexpr (C::kEarlyQRelease)
        return staging + c * (OTile::kBlockBytes / 2);
      else
        return staging + c * (C::QTile::kBlockBytes / 2) + cw * 64 * 64;
    };
    if constexpr (C::DT <= 16) {
      // Two n8 blocks per stmatrix.x4: matrix m holds rows g (m even) or
      // g + 8 (m odd) of block 2 k + m / 2, and lane 8 m + r addresses row r
      // of matrix m: DT / 2 instructions instead of 2 DT four-byte stores.
      // (D = 256 keeps the stores: there the form cost spills.)
      const int lane_row = warp_row0 + ((lane >> 3) & 1) * 8 + (lane & 7), lane_block = lane >> 4;
      static_assert(C::DT % 2 == 0);
#pragma unroll
      for (int k = 0; k < C::DT / 2; ++k) {
        std::uint32_t m[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int dt = 2 * k + q / 2, half = q % 2;
          m[q] = pack2<T>(o[dt][half * 2] * inv_sum[half], o[dt][half * 2 + 1] * inv_sum[half]);
        }
        stmatrix_x4(staged(lane_row, 2 * k + lane_block), m);
      }
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = row_in_block + half * 8;
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt)
          *reinterpret_cast<std::uint32_t*>(staged(r, dt) + 2 * t4) =
              pack2<T>(o[dt][half * 2] * inv_sum[half], o[dt][half * 2 + 1] * inv_sum[half]);
      }
    }
    CUFLASH_TIMELINE(kTlStaged);
    if (tp.out_by_tma) {
      // The writes visible to the TMA unit, then every writer past them.
      fence_proxy_async_shared();
      named_barrier_sync(C::kStagedBarrier0 + cw, 128);
      CUFLASH_TIMELINE(kTlStagedAll);
      release_stored_q();  // (an earlier item's, when this one had no step)
      if (store_leader) {
#pragma unroll
        for (int c = 0; c < C::QTile::kBlocks; ++c)
          if (c * 64 < p.head_dim)  // a narrower head dim: its blocks only (the map clips the rest)
            tma_store_4d(&tp.out, staged_box(c), c * 64, f.seq.q_start + f.m0 + cw * 64, f.h, f.b);
        bulk_commit_group();
      }
      write_lse_m16(p, f, lse, f.m0 + row_in_block, t4);
      if (stage_in_kv) {
        bulk_wait_group_read<0>();
        release_stage(last_stage);
      } else {
        stored_q = qb;
      }
      return;
    }
    // Else each warp stores its own 16 rows: whole row chunks, 16-byte
    // reads free of bank conflicts.
    __syncwarp();
    T* out_base = static_cast<T*>(p.out) + row_offset(p.out_strides, f.b, f.seq.q_start, 0, f.h);
    constexpr int kChunksPerRow = C::DC / 8;
#pragma unroll
    for (int idx = lane; idx < 16 * kChunksPerRow; idx += 32) {
      const int r = idx / kChunksPerRow, c = idx % kChunksPerRow;
      const int i = f.m0 + warp_row0 + r;
      if (i < f.seq.q_len && c * 8 < p.head_dim)  // a narrower head dim: its columns only
        *reinterpret_cast<uint4*>(out_base + static_cast<std::int64_t>(i) * p.out_strides.row + c * 8) =
            *reinterpret_cast<const uint4*>(staged(warp_row0 + r, c));
    }
    __syncwarp();
    write_lse_m16(p, f, lse, f.m0 + row_in_block, t4);
    // The Q buffer (Q and the staged O) or the stage is free for later loads.
    if (stage_in_kv) release_stage(last_stage);
    else mbarrier_arrive(&q_empty[qb]);
  };

  auto write_item = [&](const ForwardBlock& f, std::uint32_t q_item, const float (&o)[C::DT][4],
                        const float (&row_max)[2], const float (&row_sum)[2], float mult, int last_stage) {
    float inv_sum[2], lse[2];
    row_totals_m16(row_max, row_sum, mult, inv_sum, lse);
    CUFLASH_TIMELINE(kTlRows);
    write_rows(f, q_item, o, inv_sum, lse, last_stage);
  };

  ConsumerPipe<C> pipe{stage0, k_full, v_full, k_empty, v_empty, my_turn, next_turn};
  float o[C::DT][4];        // O of the current item: its first P V overwrites it
  std::uint32_t pa[C::KP][4];  // P of the pending P V
  float row_max[2], row_sum[2];
  std::uint32_t merged_items = 0;  // kSplitKeys: items whose halves went through the merge buffer
  // The items come from the producer, in its order, one per Q buffer use.
  for (std::uint32_t q_item = 0;; ++q_item) {
    // (Also for an empty item: its Q buffer is released only after the
    // load landed, so no later load races it.)
    mbarrier_wait(&q_full[q_item % C::QBuffers], q_phase(q_item));
    const WorkItemSlot slot = slots[q_item % C::QBuffers].read();
    if (slot.end) break;
    CUFLASH_TIMELINE(kTlItem);
    const ForwardBlock f = slot.block(p);
    const int n_tiles = max(f.t_hi - f.t_lo, 0);
    const float mult = Transformed ? 1.0f : f.rules.scale_log2;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.0f;
    // After an item's last step, and after its drain: what the one-Q-buffer
    // kernels signal there (kEarlyQRelease), by every consumer, idle or not.
    auto after_last_step = [&] {
      if constexpr (C::kEarlyQRelease) {
        // Every Q K^T of the item has completed (each step waited for its
        // S): the next item's Q may load under this one's drain and epilogue.
        mbarrier_arrive(&q_empty[q_item % C::QBuffers]);
        if (cw == 1 && p.num_splits == 1) named_barrier_arrive(C::kKReadBarrier, 256);
      }
    };
    auto after_drain = [&] {
      if constexpr (C::kEarlyQRelease)
        if (cw == 0 && p.num_splits == 1) named_barrier_arrive(C::kVReadBarrier, 256);
    };
    // This warpgroup's steps over the item's key tiles j0, j0 + kKeyStride,
    // ... (j0: 0, or its own index where the consumers split the keys).
    auto walk_tiles = [&](int j0) {
      const std::uint64_t q_desc = sw128_desc(sQ(q_item) + rows0 * 64, 16, 1024);
      // The item's first tile (its last keys), at half width where this
      // warpgroup's rows see only its lower half.
      int j = j0;
      if constexpr (C::kHalfFirst) {
        if (j0 == 0 && pipe.half_first(f, rows0, (f.t_hi - 1) * C::BN)) {
          pipe.template step<Transformed, StepTile::first, C::NT / 2>(f, q_desc, j, o, pa, row_max, row_sum, mult,
                                                                      f.m0 + row_in_block, t4, j == n_tiles - 1);
          release_stored_q();
          j += C::kKeyStride;
        }
      }
      if constexpr (C::kPeelFirst && !Transformed) {
        // The first step on its own, the loop's without a branch on it.
        if (j == j0) {
          pipe.template step<Transformed, StepTile::first>(f, q_desc, j, o, pa, row_max, row_sum, mult,
                                                           f.m0 + row_in_block, t4, j == n_tiles - 1);
          release_stored_q();
          j += C::kKeyStride;
        }
        // The steps whose tile every row of the block sees whole skip the
        // mask test (without a mask: all but a partial last tile).
        int unmasked_lo, unmasked_hi;
        f.rules.unmasked_steps_down(f.m0, f.rows, f.t_hi, C::BN, &unmasked_lo, &unmasked_hi);
        for (; j < n_tiles; j += C::kKeyStride)
          bool_switch(j >= unmasked_lo && j < unmasked_hi, [&](auto unmasked) {
            pipe.template step<Transformed, StepTile::later, C::NT, decltype(unmasked)::value>(
                f, q_desc, j, o, pa, row_max, row_sum, mult, f.m0 + row_in_block, t4, j == n_tiles - 1);
          });
      } else {
        for (; j < n_tiles; j += C::kKeyStride) {
          pipe.template step<Transformed>(f, q_desc, j, o, pa, row_max, row_sum, mult, f.m0 + row_in_block, t4,
                                          j == n_tiles - 1);
          if (j == j0) release_stored_q();
        }
      }
    };
    if constexpr (C::kSplitKeys) {
      // This warpgroup's key tiles of the item: j = cw, cw + 2, ... (the
      // item's first tile, its last keys, is consumer 0's).
      static_assert(!Transformed && C::kPeelFirst, "split keys: plain scores, the peeled step");
      const int own = n_tiles > cw ? (n_tiles - cw + 1) / 2 : 0;
      pipe.begin_split_item(cw);
      if (own > 0) {
        walk_tiles(cw);
        pipe.drain(o, pa, own);
      }
      pipe.end_split_item(n_tiles);
      float inv_sum[2], lse[2];
      row_totals_m16(row_max, row_sum, mult, inv_sum, lse);
      // Consumer 1's thread hands its values to the thread of consumer 0
      // that holds the same rows and columns. A warpgroup without tiles in
      // the item (O never written) gives zeros and lse -inf.
      float* merge = reinterpret_cast<float*>(smem_base + C::kMergeOffset) + tid % 128;
      constexpr int kLse = C::DT * 4;  // the merge buffer's first lse row
      if (cw == 1) {
        if (merged_items > 0) named_barrier_sync(C::kMergeFree, 256);
#pragma unroll
        for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) merge[(dt * 4 + e) * 128] = own > 0 ? o[dt][e] * inv_sum[e / 2] : 0.0f;
        merge[kLse * 128] = lse[0];
        merge[(kLse + 1) * 128] = lse[1];
        named_barrier_arrive(C::kMergeFull, 256);
        ++merged_items;
        mbarrier_arrive(&q_empty[q_item % C::QBuffers]);  // this warpgroup's reads of Q are done
        continue;
      }
      named_barrier_sync(C::kMergeFull, 256);
      float merged[C::DT][4], w_own[2], w_other[2], merged_lse[2];
      const float ones[2] = {1.0f, 1.0f};
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const MergedLse m = merge_lse(lse[half], merge[(kLse + half) * 128]);
        w_own[half] = m.weight_a * inv_sum[half];
        w_other[half] = m.weight_b;
        merged_lse[half] = m.lse;
      }
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          merged[dt][e] = (own > 0 ? o[dt][e] * w_own[e / 2] : 0.0f) + merge[(dt * 4 + e) * 128] * w_other[e / 2];
      named_barrier_arrive(C::kMergeFree, 256);
      ++merged_items;
      write_rows(f, q_item, merged, ones, merged_lse, -1);
      CUFLASH_TIMELINE(kTlEpilogue);
      continue;
    }
    // An item without key tiles, or one in which this warpgroup's rows all
    // lie past the sequence (the last block of a length that is not a
    // multiple of BM: at D = 64's 192 rows, 512 keys leave the third
    // warpgroup of every third block empty): nothing to compute. The ring's
    // protocol is kept (pass_steps), so the other warpgroups' turns and
    // stages go on as before, and the epilogue writes zeros that no row
    // takes, releasing what it would.
    if (n_tiles == 0 || rows0 >= f.rows) {
      int last_stage = -1;
      if (n_tiles > 0) {
        release_stored_q();
        pipe.pass_steps(n_tiles);
        after_last_step();
        last_stage = pipe.pass_drain();
        after_drain();
      }
      // Zeros of their own, not O's registers: zeros written to O here
      // reach the next item's first P V, and ptxas then serializes every
      // wgmma of the kernel (C7515).
      const float zeros[C::DT][4] = {};
      write_item(f, q_item, zeros, row_max, row_sum, mult, C::kEarlyQRelease ? last_stage : -1);
      CUFLASH_TIMELINE(kTlIdle);
      continue;
    }
    walk_tiles(0);
    after_last_step();
    const int last_stage = pipe.drain(o, pa, n_tiles);
    after_drain();
    write_item(f, q_item, o, row_max, row_sum, mult, C::kEarlyQRelease ? last_stage : -1);
    CUFLASH_TIMELINE(kTlEpilogue);
  }
  CUFLASH_TIMELINE(kTlEnd);
  // The last stores must have read shared memory before the CTA exits.
  release_stored_q();
  if (C::kPingPong && cw == 0) named_barrier_sync(C::kTurnBarrier0, 256);
  // Consumer 0's last read of the merge buffer signalled has its sync.
  if (C::kSplitKeys && cw == 1 && merged_items > 0) named_barrier_sync(C::kMergeFree, 256);
#endif
}

}  // namespace cuflash::detail::sm90
