// Backward pass: P recomputed from the forward's lse, float accumulation.
//
// Races are avoided by ownership rather than atomics, which also makes the
// result deterministic: a work item owns every dk/dv row it accumulates into
// and the dq rows of the query heads it serves.
//   dense, varlen: one item per (sequence, kv head);
//   KV cache:      one item per kv head, over all sequences, since sequences
//                  may share cache pages and so dk/dv rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"
#include "parallel_for.hpp"
#include "tensor_access.hpp"

namespace cuflash::detail::cpu {
namespace {

struct BackwardScratch {
  BackwardScratch(int dim, int key_tiles, std::int64_t gradient_rows)
      : queries(kQueryBlock * dim),
        output_grads(kQueryBlock * dim),
        query_grads(kQueryBlock * dim),
        probabilities(kQueryBlock * kKeyTile),
        score_grads(kQueryBlock * kKeyTile),
        softcap_tanh(kKeyTile),
        probabilities_transposed(kKeyTile * kQueryBlock),
        score_grads_transposed(kKeyTile * kQueryBlock),
        tile_key_grads(kKeyTile * dim),
        tile_value_grads(kKeyTile * dim),
        row(dim),
        keys(static_cast<std::size_t>(key_tiles) * kKeyTile * dim),
        keys_transposed(keys.size()),
        values_transposed(keys.size()),
        gradient_row_of_key(static_cast<std::size_t>(key_tiles) * kKeyTile),
        key_grads(static_cast<std::size_t>(gradient_rows) * dim),
        value_grads(static_cast<std::size_t>(gradient_rows) * dim) {}

  std::vector<float> queries;                   // [kQueryBlock][dim] as stored
  std::vector<float> output_grads;              // dout [kQueryBlock][dim]
  std::vector<float> query_grads;               // dq [kQueryBlock][dim]
  std::vector<float> probabilities;             // P [kQueryBlock][kKeyTile] (scores first)
  std::vector<float> score_grads;               // softmax_scale * dS, [kQueryBlock][kKeyTile] (dP first)
  std::vector<float> softcap_tanh;              // [kKeyTile], one row's tanh(raw / softcap)
  std::vector<float> probabilities_transposed;  // [kKeyTile][kQueryBlock]
  std::vector<float> score_grads_transposed;    // [kKeyTile][kQueryBlock]
  std::vector<float> tile_key_grads;            // [kKeyTile][dim]
  std::vector<float> tile_value_grads;          // [kKeyTile][dim]
  std::vector<float> row;                       // [dim]
  // The current sequence's keys and values, converted once (see forward.cpp).
  std::vector<float> keys;                      // [key][dim], for dq
  std::vector<float> keys_transposed;           // tiles [dim][kKeyTile], for scores
  std::vector<float> values_transposed;         // tiles [dim][kKeyTile], for dP
  std::vector<std::int64_t> gradient_row_of_key;  // row of key_grads/value_grads for each key
  std::vector<float> key_grads;                 // dk sums [gradient rows][dim]
  std::vector<float> value_grads;               // dv sums [gradient rows][dim]
  float row_lse_log2[kQueryBlock] = {};         // lse * log2(e); -inf: the row contributes nothing
  float row_delta[kQueryBlock] = {};            // D_i = dot(dout_i, out_i)
};

class BackwardRunner {
 public:
  explicit BackwardRunner(const Problem& problem)
      : problem_(problem), address_(problem), model_(problem), dim_(padded_dim(problem.head_dim)) {}

  int dim() const { return dim_; }

  int key_tiles() const {
    int longest = 0;
    for (int b = 0; b < problem_.batch; ++b) longest = std::max(longest, problem_.kv_len(b));
    return (longest + kKeyTile - 1) / kKeyTile;
  }

  // Rows of key_grads an item needs: a sequence's keys, or the whole cache.
  std::int64_t gradient_rows() const {
    if (problem_.layout == Layout::kv_cache) return address_.cache_slot_count();
    return static_cast<std::int64_t>(key_tiles()) * kKeyTile;
  }

  // dense/varlen: item = b * heads_kv + head_kv; KV cache: item = head_kv.
  // Listed longest sequence first, so that short ones fill in at the end.
  std::vector<std::int64_t> items() const {
    const int sequences = problem_.layout == Layout::kv_cache ? 1 : problem_.batch;
    std::vector<std::int64_t> order(static_cast<std::size_t>(sequences) * problem_.heads_kv);
    for (std::size_t item = 0; item < order.size(); ++item) order[item] = static_cast<std::int64_t>(item);
    if (problem_.layout == Layout::varlen) {
      auto cost = [&](std::int64_t item) {
        const int b = static_cast<int>(item / problem_.heads_kv);
        return static_cast<std::int64_t>(problem_.q_len(b)) * problem_.kv_len(b);
      };
      std::stable_sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) { return cost(x) > cost(y); });
    }
    return order;
  }

  void run(std::int64_t item, BackwardScratch& scratch) const {
    const int head_kv = static_cast<int>(item % problem_.heads_kv);
    std::fill(scratch.key_grads.begin(), scratch.key_grads.end(), 0.0f);
    std::fill(scratch.value_grads.begin(), scratch.value_grads.end(), 0.0f);
    if (problem_.layout == Layout::kv_cache) {
      for (int b = 0; b < problem_.batch; ++b) run_sequence(b, head_kv, scratch);
      for (std::int64_t slot = 0; slot < address_.cache_slot_count(); ++slot) {
        store_row(problem_.dk, address_.cache_row(problem_.dk, slot, head_kv), problem_.head_dim,
                  &scratch.key_grads[slot * dim_]);
        store_row(problem_.dv, address_.cache_row(problem_.dv, slot, head_kv), problem_.head_dim,
                  &scratch.value_grads[slot * dim_]);
      }
      return;
    }
    const int b = static_cast<int>(item / problem_.heads_kv);
    run_sequence(b, head_kv, scratch);
    for (int key = 0; key < problem_.kv_len(b); ++key) {
      store_row(problem_.dk, address_.key(problem_.dk, b, key, head_kv), problem_.head_dim,
                &scratch.key_grads[static_cast<std::int64_t>(key) * dim_]);
      store_row(problem_.dv, address_.key(problem_.dv, b, key, head_kv), problem_.head_dim,
                &scratch.value_grads[static_cast<std::int64_t>(key) * dim_]);
    }
  }

 private:
  void run_sequence(int b, int head_kv, BackwardScratch& scratch) const {
    const int kv_first = problem_.kv_first(b);
    const int kv_len = problem_.kv_len(b);
    const int key_count = (kv_len + kKeyTile - 1) / kKeyTile * kKeyTile;
    load_key_rows(address_, problem_.k, b, head_kv, 0, key_count, kv_first, kv_len, problem_.head_dim, dim_,
                  scratch.keys.data());
    load_key_tiles_transposed(address_, problem_.k, b, head_kv, 0, key_count, kv_first, kv_len, problem_.head_dim,
                              dim_, kKeyTile, scratch.row.data(), scratch.keys_transposed.data());
    load_key_tiles_transposed(address_, problem_.v, b, head_kv, 0, key_count, kv_first, kv_len, problem_.head_dim,
                              dim_, kKeyTile, scratch.row.data(), scratch.values_transposed.data());
    for (int key = 0; key < kv_len; ++key)
      scratch.gradient_row_of_key[key] = problem_.layout == Layout::kv_cache ? address_.cache_slot(b, key) : key;

    const int group = problem_.group_size();
    for (int head = head_kv * group; head < (head_kv + 1) * group; ++head)
      for (int first_row = 0; first_row < problem_.q_len(b); first_row += kQueryBlock)
        run_query_block(b, head, first_row, scratch);
  }

  void run_query_block(int b, int head, int first_row, BackwardScratch& scratch) const {
    const int q_len = problem_.q_len(b);
    const int kv_len = problem_.kv_len(b);
    const int row_count = std::min(kQueryBlock, q_len - first_row);
    const int rows_padded = round_up4(row_count);
    const ScoreRules rules = model_.rules(b, head);

    load_query_block(b, head, first_row, row_count, scratch);
    std::fill(scratch.query_grads.begin(), scratch.query_grads.end(), 0.0f);

    const KeyRange block = ScoreModel::rows_keys(rules, first_row, first_row + row_count);
    for (std::int64_t tile = block.first / kKeyTile; !block.empty() && tile <= block.last / kKeyTile; ++tile) {
      const int first_key = static_cast<int>(tile) * kKeyTile;
      const int key_count = std::min(kKeyTile, kv_len - first_key);
      const int key_cols = (key_count + 7) / 8 * 8;
      const float* keys = &scratch.keys[static_cast<std::int64_t>(first_key) * dim_];
      const float* keys_transposed = &scratch.keys_transposed[tile * dim_ * kKeyTile];
      const float* values_transposed = &scratch.values_transposed[tile * dim_ * kKeyTile];
      multiply_add<false>(scratch.queries.data(), dim_, keys_transposed, kKeyTile,
                          scratch.probabilities.data(), kKeyTile, rows_padded, key_cols, dim_);
      multiply_add<false>(scratch.output_grads.data(), dim_, values_transposed, kKeyTile,
                          scratch.score_grads.data(), kKeyTile, rows_padded, key_cols, dim_);
      for (int r = 0; r < row_count; ++r)
        score_gradients(b, head, r, first_row + r, first_key, key_count, rules, scratch);
      for (int r = row_count; r < rows_padded; ++r) {
        std::fill_n(&scratch.probabilities[r * kKeyTile], kKeyTile, 0.0f);
        std::fill_n(&scratch.score_grads[r * kKeyTile], kKeyTile, 0.0f);
      }
      transpose_tile(scratch, row_count, key_count);

      // dq += dS K;  dk_tile = dS^T Q;  dv_tile = P^T dO.
      multiply_add<true>(scratch.score_grads.data(), kKeyTile, keys, dim_, scratch.query_grads.data(), dim_,
                         rows_padded, dim_, key_count);
      const int keys_padded = round_up4(key_count);
      multiply_add<false>(scratch.score_grads_transposed.data(), kQueryBlock, scratch.queries.data(), dim_,
                          scratch.tile_key_grads.data(), dim_, keys_padded, dim_, row_count);
      multiply_add<false>(scratch.probabilities_transposed.data(), kQueryBlock, scratch.output_grads.data(), dim_,
                          scratch.tile_value_grads.data(), dim_, keys_padded, dim_, row_count);
      for (int j = 0; j < key_count; ++j) {
        const std::int64_t gradient_row = scratch.gradient_row_of_key[first_key + j];
        float* key_sum = &scratch.key_grads[gradient_row * dim_];
        float* value_sum = &scratch.value_grads[gradient_row * dim_];
        const float* tile_key = &scratch.tile_key_grads[j * dim_];
        const float* tile_value = &scratch.tile_value_grads[j * dim_];
        for (int d = 0; d < dim_; ++d) key_sum[d] += tile_key[d];
        for (int d = 0; d < dim_; ++d) value_sum[d] += tile_value[d];
      }
    }

    for (int r = 0; r < row_count; ++r)
      store_row(problem_.dq, address_.query(problem_.dq, b, first_row + r, head), problem_.head_dim,
                &scratch.query_grads[r * dim_]);
  }

  void load_query_block(int b, int head, int first_row, int row_count, BackwardScratch& scratch) const {
    std::fill(scratch.queries.begin(), scratch.queries.end(), 0.0f);
    std::fill(scratch.output_grads.begin(), scratch.output_grads.end(), 0.0f);
    for (int r = 0; r < row_count; ++r) {
      const int row = first_row + r;
      float* query = &scratch.queries[r * dim_];
      float* output_grad = &scratch.output_grads[r * dim_];
      load_row(problem_.q, address_.query(problem_.q, b, row, head), problem_.head_dim, query);
      load_row(problem_.dout, address_.query(problem_.dout, b, row, head), problem_.head_dim, output_grad);
      load_row(problem_.out, address_.query(problem_.out, b, row, head), problem_.head_dim, scratch.row.data());
      // Accumulated in double: D_i is subtracted from every dP_ij of the row.
      double delta = 0.0;
      for (int d = 0; d < problem_.head_dim; ++d)
        delta += static_cast<double>(output_grad[d]) * static_cast<double>(scratch.row[d]);
      scratch.row_delta[r] = static_cast<float>(delta);
      scratch.row_lse_log2[r] = load_f32(problem_.lse, address_.lse(problem_.lse, b, row, head)) * kLog2e;
    }
  }

  // Row r of the tile: scores -> P, dP -> softmax_scale * dS, in place. With
  // dropout (Z = mask / (1 - p)): dS = P (Z dP - D) and P becomes Z P, for dv.
  void score_gradients(int b, int head, int r, int row, int first_key, int key_count, const ScoreRules& rules,
                       BackwardScratch& scratch) const {
    float* probabilities = &scratch.probabilities[r * kKeyTile];
    float* score_grads = &scratch.score_grads[r * kKeyTile];
    const float lse_log2 = scratch.row_lse_log2[r];
    // lse = -inf: the forward saw no key for this row, so it has no gradient.
    if (lse_log2 == kNegInf) {
      std::fill_n(probabilities, kKeyTile, 0.0f);
      std::fill_n(score_grads, kKeyTile, 0.0f);
      return;
    }
    float* softcap_tanh = model_.has_softcap() ? scratch.softcap_tanh.data() : nullptr;
    ScoreModel::finish_scores(probabilities, key_count, first_key, row, rules, softcap_tanh);
    const float delta = scratch.row_delta[r];
    const float scale = problem_.softmax_scale;
    exp2_shifted(probabilities, key_count, lse_log2);
    if (problem_.has_dropout()) {
      const float keep_scale = model_.dropout_scale();
      for (int j = 0; j < key_count; ++j) {
        const bool kept = dropout_keeps(problem_.dropout, b, head, problem_.heads_q, row, first_key + j);
        const float z = kept ? keep_scale : 0.0f;
        float grad = probabilities[j] * (score_grads[j] * z - delta);
        if (softcap_tanh) grad *= ScoreRules::softcap_grad(softcap_tanh[j]);
        score_grads[j] = grad * scale;
        probabilities[j] *= z;
      }
    } else {
      for (int j = 0; j < key_count; ++j) {
        float grad = probabilities[j] * (score_grads[j] - delta);
        if (softcap_tanh) grad *= ScoreRules::softcap_grad(softcap_tanh[j]);
        score_grads[j] = grad * scale;
      }
    }
    std::fill(probabilities + key_count, probabilities + kKeyTile, 0.0f);
    std::fill(score_grads + key_count, score_grads + kKeyTile, 0.0f);
  }

  static void transpose_tile(BackwardScratch& scratch, int row_count, int key_count) {
    for (int j = 0; j < key_count; ++j) {
      for (int r = 0; r < row_count; ++r) {
        scratch.probabilities_transposed[j * kQueryBlock + r] = scratch.probabilities[r * kKeyTile + j];
        scratch.score_grads_transposed[j * kQueryBlock + r] = scratch.score_grads[r * kKeyTile + j];
      }
    }
  }

  const Problem& problem_;
  RowAddress address_;
  ScoreModel model_;
  int dim_;
};

// Varlen packed rows outside [cu[0], cu[B]) belong to no sequence; backward
// still owes them zeros.
void zero_unowned_varlen_rows(const Problem& problem) {
  auto zero_rows = [&](const TensorView& view, const std::vector<std::int32_t>& cu_seqlens) {
    const std::int64_t begin = cu_seqlens.front();
    const std::int64_t end = cu_seqlens.back();
    for (std::int64_t row = 0; row < view.shape[0]; ++row) {
      if (row >= begin && row < end) continue;
      for (std::int64_t head = 0; head < view.shape[1]; ++head)
        store_zero_row(view, row * view.strides[0] + head * view.strides[1], problem.head_dim);
    }
  };
  zero_rows(problem.dq, problem.host_cu_seqlens_q);
  zero_rows(problem.dk, problem.host_cu_seqlens_k);
  zero_rows(problem.dv, problem.host_cu_seqlens_k);
}

}  // namespace

// The sink is one more entry of every row's softmax, with no value: its
// dP is 0, so dS_sink = P_sink (0 - D_i) for each row that has it.
void write_sink_gradients(const Problem& problem) {
  const RowAddress address(problem);
  const int dim = problem.head_dim;
  parallel_for(problem.heads_q, [&](std::int64_t item, int) {
    const int head = static_cast<int>(item);
    const auto* sinks = static_cast<const float*>(problem.sinks.data);
    const double sink = problem.has_sinks ? sinks[head * problem.sinks.strides[0]] : 0.0;
    std::vector<float> output_grad(dim), output(dim);
    double total = 0.0;
    for (int b = 0; b < problem.batch; ++b) {
      for (int row = 0; row < problem.q_len(b); ++row) {
        if (std::isinf(sink) && sink < 0) continue;  // a sink of -inf: probability 0
        const double lse = load_f32(problem.lse, address.lse(problem.lse, b, row, head));
        load_row(problem.dout, address.query(problem.dout, b, row, head), dim, output_grad.data());
        load_row(problem.out, address.query(problem.out, b, row, head), dim, output.data());
        double delta = 0.0;
        for (int d = 0; d < dim; ++d) delta += static_cast<double>(output_grad[d]) * output[d];
        total -= std::exp(sink - lse) * delta;
      }
    }
    store_f32(problem.dsinks, head * problem.dsinks.strides[0], static_cast<float>(total));
  });
}

void run_backward(const Problem& problem) {
  if (!problem.dsinks.empty()) write_sink_gradients(problem);
  if (problem.layout == Layout::varlen) zero_unowned_varlen_rows(problem);
  const BackwardRunner runner(problem);
  const std::vector<std::int64_t> items = runner.items();
  const std::int64_t item_count = static_cast<std::int64_t>(items.size());
  std::vector<BackwardScratch> scratch;
  const int workers = worker_count(item_count);
  scratch.reserve(workers);
  for (int worker = 0; worker < workers; ++worker)
    scratch.emplace_back(runner.dim(), runner.key_tiles(), runner.gradient_rows());
  parallel_for(item_count, [&](std::int64_t index, int worker) { runner.run(items[index], scratch[worker]); });
}

}  // namespace cuflash::detail::cpu
