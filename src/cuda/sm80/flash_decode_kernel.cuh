// Decode / paged-KV attention on mma.sync (sm80+; the same code runs on sm90).
//
// One CTA per (kv heads x row block, split, sequence); the kv heads vary
// fastest, so CTAs that run together read the same keys' rows of
// neighbouring heads, which share DRAM pages in a [.., slot, Hk, D] cache.
// A CTA's query rows are the group's query heads x the sequence's queries,
// row r = i * group + head in group (a GQA decode step of 4 heads is 4 rows),
// padded to m16 tiles: the K/V of a kv head are read once for all the heads
// that share them.
//
// Decode moves every cache byte once and does ~2 FLOP per byte with 4 of 16
// mma rows doing real work: it is a copy loop. So, unlike the prefill kernel,
// warps split the keys rather than the rows, every warp keeps all rows of
// its head and a private online softmax, and K/V stream through a cp.async
// pipeline; the partial (max, sum, O) of a head's warps meet once, through
// shared memory, at the end. Two shapes (flash_decode_tiles.hpp):
//  - per head: one kv head, four warps taking 16 keys each of a 64-key tile;
//  - wide: NH kv heads, a warp per head taking all 16 keys of a tile, so the
//    CTA reads each key's NH x D run of the cache in one piece (page-order
//    independent bandwidth, NOTES.md decode round 4).
//
// Pages: sm80/decode_kv_loader.cuh finds each page through the block table.
// Split-KV: split s of a sequence takes its share of the key tiles the rows
// can see and writes a normalized partial (out, lse) for combine_splits.
#pragma once

#include <cmath>

#include "common/attention_params.hpp"
#include "common/dependent_launch.cuh"
#include "common/kv_cache.cuh"
#include "common/online_softmax.cuh"
#include "common/rotary_chunk.cuh"
#include "common/score_mask.cuh"
#include "common/swizzled_rows.hpp"
#include "common/tensor_core.cuh"
#include "sm80/decode_kv_loader.cuh"
#include "sm80/flash_decode_tiles.hpp"

namespace cuflash::detail::sm80 {

// Wide: the CTA reads decode_wide_heads(D) kv heads, a warp each
// (flash_decode_tiles.hpp); otherwise one kv head, four warps.
template <typename T, int D_, int MT_, bool Wide = false>
struct DecodeConfig {
  using Element = T;
  static constexpr int D = D_, MT = MT_;
  static constexpr DecodeShape kShape = decode_shape(D, Wide);
  static constexpr int NH = kShape.heads;  // kv heads per CTA
  static constexpr int NW = kShape.warps, kThreads = NW * 32;
  static constexpr int WH = NW / NH;  // warps per head: they split each tile's keys
  static constexpr int BN = kShape.block_n;
  static constexpr int KW = BN / WH;  // keys of a tile per warp
  static constexpr int STAGES = kShape.stages;
  static constexpr int BM = 16 * MT;  // query rows per CTA and head
  static constexpr int NT = KW / 8;   // n8 tiles of S per warp
  static constexpr int KQ = D / 16;   // k-steps of Q K^T
  static constexpr int KP = KW / 16;  // k-steps of P V
  static constexpr int DT = D / 8;    // n8 tiles of O
  using Rows = SwizzledRows<D>;       // Q, K and V tiles in shared memory
  static constexpr int kPitch = Rows::kPitch;
  static constexpr int kHeadTileElems = BN * kPitch;          // one head's K (or V) rows of a tile
  static constexpr int kStageElems = 2 * NH * kHeadTileElems;  // the heads' K tiles, then their V tiles
  // Epilogue: each warp's scaled O rows as floats, padded by 8 so that the
  // float2 fragment stores of a half-warp hit 32 distinct banks.
  static constexpr int kOutRow = D + 8;
  static constexpr int kSmemBytes = decode_smem_bytes(D, MT, static_cast<int>(sizeof(T)), Wide);
  static_assert(NH >= 1 && NW % NH == 0, "whole warps per head");
  static_assert(!Wide || MT == 1, "the wide variant holds one m16 tile of rows");
  static_assert(KW % 16 == 0, "a warp's keys must fill whole k-steps of P V");
  static_assert(D % 16 == 0, "head_dim must be a multiple of 16");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static_assert(NW * BM * kOutRow * 4 <= STAGES * kStageElems * static_cast<int>(sizeof(T)),
                "the epilogue's float rows must fit in the stage buffers they reuse");
};

// The CTA's BM query rows of each of its kv heads hk0, hk0 + 1, ... into
// shared memory (head after head); rows past the group's heads x q_len are
// zero-filled (computed on, never stored). With a rotary embedding the rows
// are rotated on their way (rotary_chunk.cuh): read and stored by the
// threads rather than by cp.async, which the first tile's barrier orders as well.
template <class C>
__device__ __forceinline__ void load_q_rows(typename C::Element* sQ, const ForwardParams& p, int b, int hk0, int row0,
                                            int rows_total) {
  using T = typename C::Element;
  constexpr int kChunksPerRow = C::D / 8;
  const T* q = static_cast<const T*>(p.q);
  const RotaryParams& rotary = p.cache.rotary;
  const bool rotate = rotary.cos != nullptr;
  const int cached = rotate ? cache_cached_len(p.cache, b) : 0;
#pragma unroll
  for (int idx = threadIdx.x; idx < C::NH * C::BM * kChunksPerRow; idx += C::kThreads) {
    const int hr = idx / kChunksPerRow, c = idx % kChunksPerRow;  // hr: head-local x BM + r
    const int row = row0 + hr % C::BM;
    const bool valid = row < rows_total && c * 8 < p.head_dim;  // columns past the head dim: zeros
    const int i = row / p.group, h = (hk0 + hr / C::BM) * p.group + row % p.group;
    const T* q_row = valid ? q + row_offset(p.q_strides, b, 0, i, h) : q;
    if (rotate) {
      *reinterpret_cast<uint4*>(sQ + C::Rows::offset(hr, c)) =
          valid ? rotated_chunk(q_row, c, rotary_query_position(cached, i, rotary.positional), rotary)
                : make_uint4(0, 0, 0, 0);
    } else {
      cp_async_16(sQ + C::Rows::offset(hr, c), valid ? q_row + c * 8 : q, valid);
    }
  }
}

// Transformed: softcap or ALiBi is on (a separate instantiation keeps that
// code and its registers out of the plain kernel, as in the prefill).
template <class C, bool Transformed>
__global__ void __launch_bounds__(C::kThreads) flash_decode_kernel(const ForwardParams p) {
  using T = typename C::Element;
  extern __shared__ __align__(1024) unsigned char smem_raw[];  // rows of 2^n bytes: see tile_address
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sStages = sQ + C::NH * C::BM * C::kPitch;
  float* sRowMax = reinterpret_cast<float*>(sStages + C::STAGES * C::kStageElems);  // [NW][BM], base 2
  float* sRowSum = sRowMax + C::NW * C::BM;                                         // [NW][BM]
  float* sOut = reinterpret_cast<float*>(sStages);  // [NW][BM][kOutRow], after the last tile
  // With splits, the combine is launched behind this kernel as a dependent:
  // once every CTA is running, its CTAs may take the SMs' spare slots and
  // wait there (it reads nothing before this grid has finished).
  allow_dependent_launch();

  const int head_blocks = p.heads_kv / C::NH;  // the host launches wide CTAs only where NH divides heads_kv
  const int hk0 = static_cast<int>(blockIdx.x % head_blocks) * C::NH;
  const int row0 = static_cast<int>(blockIdx.x / head_blocks) * C::BM;
  const int split = blockIdx.y;
  const int b = blockIdx.z;
  const int group = p.group;
  const int rows_total = group * p.max_q_len;
  const int rows_here = min(C::BM, rows_total - row0);

  SeqBounds seq;
  seq.q_len = p.max_q_len;
  seq.k_len = cache_kv_len(p.cache, b);
  seq.k_first = cache_first_key(p.cache, b);  // a leftpad: the score rules mask the keys before it
  // Masks depend on the sequence only; the ALiBi slope, on the head, is per row below.
  const ScoreRules rules = score_rules(p, seq, b, hk0 * group);
  const int i_first = row0 / group;
  const int i_count = (row0 + rows_here - 1) / group - i_first + 1;

  // This split's share of the key tiles the CTA's rows can see.
  int key_lo, key_hi;
  rules.key_range(i_first, i_count, &key_lo, &key_hi);
  const int first_tile = key_lo / C::BN;
  const long long span = key_hi > key_lo ? (key_hi + C::BN - 1) / C::BN - first_tile : 0;
  const int t_lo = first_tile + static_cast<int>(span * split / p.num_splits);
  const int t_hi = first_tile + static_cast<int>(span * (split + 1) / p.num_splits);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t4 = lane % 4;
  // This warp's kv head and its share of each tile's keys.
  const int head = warp / C::WH, key_part = warp % C::WH;
  const int hk = hk0 + head;

  // The two rows (g, g + 8) of each m16 tile this lane holds: query position,
  // visible keys and (Transformed) ALiBi slope.
  int row_i[C::MT][2], row_lo[C::MT][2], row_hi[C::MT][2];
  float row_slope[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row0 + mt * 16 + g + half * 8;
      row_i[mt][half] = min(row / group, p.max_q_len - 1);  // padding rows: any valid position
      rules.row_keys(row_i[mt][half], &row_lo[mt][half], &row_hi[mt][half]);
      row_slope[mt][half] = 0.0f;
      if (Transformed && p.alibi_slopes != nullptr) {
        const int h = hk * group + row % group;
        row_slope[mt][half] = p.alibi_slopes[b * p.alibi_batch_stride + h * p.alibi_head_stride] * kLog2e;
      }
    }

  float o[C::MT][C::DT][4];
  float row_max[C::MT][2], row_sum[C::MT][2];
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }
  // Multiplier from the (possibly transformed) score to a base-2 logit.
  const float mult = Transformed ? 1.0f : rules.scale_log2;

  if (t_lo < t_hi) {
    // Prologue: Q with the first tile, then STAGES - 1 tiles in flight. A
    // group is committed even when it is empty, so that the wait count below
    // is the same in every iteration.
    DecodeKvLoader<C> loader(p, b, hk0);
    loader.start(t_lo);
    load_q_rows<C>(sQ, p, b, hk0, row0, rows_total);
#pragma unroll
    for (int s = 0; s < C::STAGES - 1; ++s) {
      if (t_lo + s < t_hi) {
        T* stage = sStages + s * C::kStageElems;
        loader.load(stage, stage + C::NH * C::kHeadTileElems, t_lo + s, seq.k_first, seq.k_len);
      }
      cp_async_commit();
    }

    // ldmatrix row addresses. A lane's rows keep their (row & 7), and chunk
    // 2s + h of a row sits at ((2s + h) ^ (row & 7)) * 16 bytes: where rows
    // take 2^n bytes, past every chunk's bits, and stages start on a row,
    // moving s k-steps (Q K^T) or d-pairs (P V) along the row is an XOR of
    // s << 5 on the s = 0 address, one instruction (D = 192's 384-byte rows
    // add the swizzled offset instead).
    constexpr std::uint32_t kRowBytes = C::kPitch * sizeof(T);
    constexpr bool kXorSteps = (kRowBytes & (kRowBytes - 1)) == 0 && kRowBytes >= 16 * (C::D / 8);
    static_assert(!kXorSteps || (C::kStageElems * sizeof(T)) % kRowBytes == 0, "stages start on a row");
    const std::uint32_t stage_base = smem_address(sStages) + (head * C::BN + key_part * C::KW) * kRowBytes;
    const T* sQ_head = sQ + head * C::BM * C::kPitch;
    // Lane's row `row` of the tile at `base`, at chunk 2s + h.
    auto tile_address = [&](std::uint32_t base, int row, int h, int s) -> std::uint32_t {
      if constexpr (kXorSteps) return (base + C::Rows::offset(row, h) * sizeof(T)) ^ (s << 5);
      return base + C::Rows::offset(row, s * 2 + h) * sizeof(T);
    };

    for (int tile = t_lo; tile < t_hi; ++tile) {
      const int it = tile - t_lo;
      // Refill the stage of the previous tile (once every warp is past it)
      // before waiting for this one, so that STAGES tiles are in flight at
      // the wait, not STAGES - 1: decode is bound by bytes in flight, and the
      // extra barrier is cheap next to a tile's load.
      __syncthreads();
      if (tile + C::STAGES - 1 < t_hi) {
        T* stage = sStages + ((it + C::STAGES - 1) % C::STAGES) * C::kStageElems;
        loader.load(stage, stage + C::NH * C::kHeadTileElems, tile + C::STAGES - 1, seq.k_first, seq.k_len);
      }
      cp_async_commit();
      cp_async_wait<C::STAGES - 1>();  // this tile's group (and Q) has landed
      __syncthreads();                 // ... for every thread

      // This warp's keys: a whole number of swizzle periods into the tile.
      const std::uint32_t sK = stage_base + (it % C::STAGES) * (C::kStageElems * sizeof(T));
      const std::uint32_t sV = sK + C::NH * C::kHeadTileElems * sizeof(T);
      const int n0 = tile * C::BN + key_part * C::KW;  // this warp's first key

      // S = Q K^T over this warp's keys.
      float s[C::MT][C::NT][4];
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < C::KQ; ++ks) {
        std::uint32_t qa[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt)
          ldmatrix_x4(qa[mt], sQ_head + C::Rows::offset(mt * 16 + lane % 16, ks * 2 + lane / 16));
#pragma unroll
        for (int np = 0; np < C::NT / 2; ++np) {
          std::uint32_t kb[4];
          ldmatrix_x4(kb, tile_address(sK, np * 16 + lane % 8 + (lane / 16) * 8, (lane / 8) % 2, ks));
          const std::uint32_t b0[2] = {kb[0], kb[1]};
          const std::uint32_t b1[2] = {kb[2], kb[3]};
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt) {
            mma_16816<T>(s[mt][2 * np], qa[mt], b0);
            mma_16816<T>(s[mt][2 * np + 1], qa[mt], b1);
          }
        }
      }

      // Scores -> (masked) logits; this warp's online softmax.
      const bool masked = !rules.tile_unmasked(i_first, i_count, tile * C::BN, C::BN);
      float correction[C::MT][2];
      bool new_max = false;
#pragma unroll
      for (int mt = 0; mt < C::MT; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if (Transformed || masked) {
#pragma unroll
            for (int nt = 0; nt < C::NT; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int j = n0 + nt * 8 + 2 * t4 + e;
                float& x = s[mt][nt][half * 2 + e];
                if constexpr (Transformed) x = rules.logit2(x, row_i[mt][half], j, row_slope[mt][half]);
                if (j < row_lo[mt][half] || j >= row_hi[mt][half]) x = -INFINITY;
              }
          }
          const float max_before = row_max[mt][half];
          correction[mt][half] = online_softmax_row_step<C::NT, RunningMax::exact>(
              [&](int nt, int e) -> float& { return s[mt][nt][half * 2 + e]; }, row_max[mt][half], row_sum[mt][half],
              mult);
          new_max = new_max || row_max[mt][half] != max_before;
        }
      }
      // O is rescaled only when some row's max moved: otherwise every
      // correction is exactly 1 (or O is still 0), and over a long cache the
      // max rarely moves after the first tiles. This skips C::DT * 4 FMULs
      // per m16 tile, a quarter of a tile's non-load instructions.
      if (__any_sync(0xffffffffu, new_max)) {
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
          for (int dt = 0; dt < C::DT; ++dt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[mt][dt][e] *= correction[mt][e / 2];
      }

      // O += P V over this warp's keys, P straight from the S accumulators.
#pragma unroll
      for (int kk = 0; kk < C::KP; ++kk) {
        std::uint32_t pa[C::MT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; ++mt) {
          pa[mt][0] = pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < C::DT / 2; ++dp) {
          std::uint32_t vb[4];
          ldmatrix_x4_trans(vb, tile_address(sV, kk * 16 + lane % 8 + ((lane / 8) % 2) * 8, lane / 16, dp));
          const std::uint32_t b0[2] = {vb[0], vb[1]};
          const std::uint32_t b1[2] = {vb[2], vb[3]};
#pragma unroll
          for (int mt = 0; mt < C::MT; ++mt) {
            mma_16816<T>(o[mt][2 * dp], pa[mt], b0);
            mma_16816<T>(o[mt][2 * dp + 1], pa[mt], b1);
          }
        }
      }
    }
    cp_async_wait<0>();  // only empty groups remain, but the stages are reused below
  }

  // Epilogue 1: each warp's row maxima (base 2) and sums.
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float l = online_softmax_row_total(row_sum[mt][half]);
      if (t4 == 0) {
        const int r = mt * 16 + g + half * 8;
        sRowMax[warp * C::BM + r] = row_max[mt][half] == -INFINITY ? -INFINITY : row_max[mt][half] * mult;
        sRowSum[warp * C::BM + r] = l;
      }
    }
  __syncthreads();  // stats visible; every warp is done with the stage buffers

  // Max and sum of head hl's row r over that head's warps; max -inf: no key seen.
  auto merged_row = [&](int hl, int r, float* m_all, float* l_all) {
    float m = -INFINITY;
#pragma unroll
    for (int w = hl * C::WH; w < (hl + 1) * C::WH; ++w) m = fmaxf(m, sRowMax[w * C::BM + r]);
    float l = 0.0f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = hl * C::WH; w < (hl + 1) * C::WH; ++w)
        l += sRowSum[w * C::BM + r] * fast_exp2(sRowMax[w * C::BM + r] - m);
    }
    *m_all = m;
    *l_all = l;
  };

  // Epilogue 2: each warp's O rows, rescaled to its head's max and normalized.
#pragma unroll
  for (int mt = 0; mt < C::MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + half * 8;
      if (r >= rows_here) continue;
      float m_all, l_all;
      merged_row(head, r, &m_all, &l_all);
      const float own = sRowMax[warp * C::BM + r];
      const float factor = m_all == -INFINITY || l_all == 0.0f ? 0.0f : fast_exp2(own - m_all) / l_all;
      float* dst = sOut + (warp * C::BM + r) * C::kOutRow + 2 * t4;
#pragma unroll
      for (int dt = 0; dt < C::DT; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) =
            make_float2(o[mt][dt][half * 2] * factor, o[mt][dt][half * 2 + 1] * factor);
    }
  __syncthreads();

  // Epilogue 3: sum over each head's warps, 4 dims per thread; write out (or
  // this split's partial) and lse.
  const std::int64_t partial_base = (static_cast<std::int64_t>(split) * p.batch + b) * p.heads_q;
  constexpr int kQuads = C::D / 4;
  for (int idx = tid; idx < C::NH * rows_here * kQuads; idx += C::kThreads) {
    const int hl = idx / (rows_here * kQuads), r = idx / kQuads % rows_here, c4 = idx % kQuads;
    if (c4 * 4 >= p.head_dim) continue;  // only the caller's columns (a multiple of 8: whole quads)
    const float* own = sOut + (hl * C::WH * C::BM + r) * C::kOutRow + c4 * 4;
    float4 acc = *reinterpret_cast<const float4*>(own);
#pragma unroll
    for (int w = 1; w < C::WH; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(own + w * C::BM * C::kOutRow);
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    const int row = row0 + r;
    const int i = row / group, h = (hk0 + hl) * group + row % group;
    if (p.num_splits > 1) {
      float* dst = p.out_partial + ((partial_base + h) * p.max_q_len + i) * p.head_dim + c4 * 4;
      *reinterpret_cast<float4*>(dst) = acc;
    } else {
      T* dst = static_cast<T*>(p.out) + row_offset(p.out_strides, b, 0, i, h) + c4 * 4;
      *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<T>(acc.x, acc.y), pack2<T>(acc.z, acc.w));
    }
  }
  for (int idx = tid; idx < C::NH * rows_here; idx += C::kThreads) {
    const int hl = idx / rows_here, r = idx % rows_here;
    float m_all, l_all;
    merged_row(hl, r, &m_all, &l_all);
    const float lse = m_all == -INFINITY || l_all == 0.0f ? -INFINITY : (m_all + __log2f(l_all)) * kLn2;
    const int row = row0 + r;
    const int i = row / group, h = (hk0 + hl) * group + row % group;
    if (p.num_splits > 1) {
      p.lse_partial[(partial_base + h) * p.max_q_len + i] = lse;
    } else if (p.lse != nullptr) {
      p.lse[lse_offset(p, b, 0, i, h)] = lse;
    }
  }
}

}  // namespace cuflash::detail::sm80
