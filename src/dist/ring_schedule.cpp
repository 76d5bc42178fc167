#include "cuflash/ring_schedule.hpp"

#include <algorithm>
#include <string>

namespace cuflash {
namespace {

enum class BlockKind { none, full, partial };

// What the queries of one chunk see of the keys of another, chunk_len rows
// each, the query chunk's first row `offset` positions after the key chunk's:
// row i sees keys [max(0, i + offset - left), min(C - 1, i + offset + right)].
BlockKind classify(std::int64_t offset, std::int64_t chunk_len, int left, int right) {
  const std::int64_t last = chunk_len - 1;
  const bool all = (right < 0 || offset + right >= last) && (left < 0 || last + offset - left <= 0);
  if (all) return BlockKind::full;
  // Rows with some key: i >= -offset - right and i <= last - offset + left.
  const std::int64_t first_row = right < 0 ? 0 : std::max<std::int64_t>(0, -offset - right);
  const std::int64_t last_row = left < 0 ? last : std::min<std::int64_t>(last, last - offset + left);
  return first_row > last_row ? BlockKind::none : BlockKind::partial;
}

// Without windows and ALiBi the kind follows from the chunks' order alone,
// whatever their length: earlier keys are all seen, later ones none, and a
// chunk sees itself causally (equal lengths: the default alignment is exact).
BlockKind classify_causal(int q_chunk, int k_chunk) {
  return k_chunk < q_chunk ? BlockKind::full : k_chunk == q_chunk ? BlockKind::partial : BlockKind::none;
}

}  // namespace

int ring_chunks_per_rank(RingLayout layout) { return layout == RingLayout::zigzag ? 2 : 1; }

int ring_global_chunk(RingLayout layout, int world_size, int rank, int local) {
  if (layout == RingLayout::contiguous) return rank;
  return local == 0 ? rank : 2 * world_size - 1 - rank;
}

Status ring_step_calls(RingLayout layout, int world_size, int rank, int kv_rank, const RingMask& mask,
                       bool varlen, std::int64_t chunk_len, std::vector<RingCall>* calls) {
  calls->clear();
  if (world_size < 1) return Status::invalid("world_size: expected >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    return Status::invalid("rank: expected 0 <= rank < " + std::to_string(world_size) + ", got " + std::to_string(rank));
  if (kv_rank < 0 || kv_rank >= world_size)
    return Status::invalid("kv_rank: expected 0 <= kv_rank < " + std::to_string(world_size) + ", got " +
                           std::to_string(kv_rank));
  const bool windowed = mask.window_left >= 0 || (!mask.causal && mask.window_right >= 0);
  if (varlen && windowed)
    return Status::invalid("window_size: ring attention over varlen batches takes no sliding window (each "
                           "sequence's chunks have their own length, so a block's positions are not one offset)");
  if (varlen && mask.alibi)
    return Status::invalid("alibi_slopes: ring attention over varlen batches takes no ALiBi (each sequence's "
                           "chunks have their own length, so a block's positions are not one offset)");
  if (!varlen && chunk_len < 1)
    return Status::invalid("chunk_len: expected >= 1 rows per chunk, got " + std::to_string(chunk_len));

  const int chunks = ring_chunks_per_rank(layout);
  const int right = mask.causal ? 0 : mask.window_right;
  const bool by_order = !windowed && !mask.alibi;  // kinds need no positions

  BlockKind kind[2][2];
  std::int64_t offset[2][2];
  for (int qc = 0; qc < chunks; ++qc)
    for (int kc = 0; kc < chunks; ++kc) {
      const int gq = ring_global_chunk(layout, world_size, rank, qc);
      const int gk = ring_global_chunk(layout, world_size, kv_rank, kc);
      offset[qc][kc] = static_cast<std::int64_t>(gq - gk) * chunk_len;
      if (!mask.causal && !windowed)
        kind[qc][kc] = BlockKind::full;
      else if (by_order)
        kind[qc][kc] = classify_causal(gq, gk);
      else
        kind[qc][kc] = classify(offset[qc][kc], chunk_len, mask.window_left, right);
    }

  if (!varlen && by_order) {
    // One call where one does: a rectangle of fully seen blocks, or a rank's
    // own block under a causal mask, which in zigzag order is exactly the
    // causal mask of the rank's concatenated chunks (its first chunk sees
    // itself causally and not the later second one; the second sees the
    // first in full and itself causally).
    if (mask.causal && kv_rank == rank) {
      calls->push_back({0, chunks, 0, chunks, true, -1, -1, std::nullopt});
      return {};
    }
    int q_lo = chunks, q_hi = -1, k_lo = chunks, k_hi = -1, seen = 0;
    bool all_full = true;
    for (int qc = 0; qc < chunks; ++qc)
      for (int kc = 0; kc < chunks; ++kc) {
        if (kind[qc][kc] == BlockKind::none) continue;
        all_full = all_full && kind[qc][kc] == BlockKind::full;
        q_lo = std::min(q_lo, qc), q_hi = std::max(q_hi, qc);
        k_lo = std::min(k_lo, kc), k_hi = std::max(k_hi, kc);
        ++seen;
      }
    if (seen == 0) return {};
    if (all_full && seen == (q_hi - q_lo + 1) * (k_hi - k_lo + 1)) {
      calls->push_back({q_lo, q_hi - q_lo + 1, k_lo, k_hi - k_lo + 1, false, -1, -1, std::nullopt});
      return {};
    }
  }

  for (int qc = 0; qc < chunks; ++qc)
    for (int kc = 0; kc < chunks; ++kc) {
      RingCall call{qc, 1, kc, 1, false, -1, -1, std::nullopt};
      switch (kind[qc][kc]) {
        case BlockKind::none: continue;
        case BlockKind::full:
          // ALiBi's bias depends on positions even where nothing is masked.
          if (mask.alibi) call.diagonal_offset = offset[qc][kc];
          break;
        case BlockKind::partial:
          call.causal = mask.causal;
          call.window_left = mask.window_left;
          call.window_right = mask.causal ? -1 : mask.window_right;
          // Same-position chunks of equal length are the default alignment;
          // saying so keeps the call open to backends without offsets.
          if (!by_order) call.diagonal_offset = offset[qc][kc];
          break;
      }
      calls->push_back(call);
    }
  return {};
}

}  // namespace cuflash
