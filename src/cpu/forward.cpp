// Forward pass: FlashAttention-style tiling with an online softmax in base 2,
// float accumulation whatever the storage dtype.
//
// A work item is a run of query rows of one (sequence, kv head), for every
// query head of that kv head's group. The item first converts the keys and
// values it will read into contiguous float tiles: read in place, the rows of
// one head sit heads*head_dim elements apart, which maps them onto a few cache
// sets and makes every query block miss; converted once, f16/bf16 keys are not
// converted again per query block either.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_kernels.hpp"
#include "parallel_for.hpp"
#include "rotary_rows.hpp"
#include "tensor_access.hpp"

namespace cuflash::detail::cpu {
namespace {

struct WorkItem {
  int batch_index = 0;
  int head_kv = 0;
  int first_row = 0;
  int end_row = 0;
  std::int64_t cost = 0;  // score evaluations, for scheduling only
};

// Per-worker buffers, allocated before the workers start.
struct ForwardScratch {
  ForwardScratch(int dim, int key_tiles, int rotary_floats)
      : queries(kQueryBlock * dim),
        probabilities(kQueryBlock * kKeyTile),
        accumulator(kQueryBlock * dim),
        row(dim),
        keys_transposed(static_cast<std::size_t>(key_tiles) * dim * kKeyTile),
        values(static_cast<std::size_t>(key_tiles) * kKeyTile * dim),
        rotary(rotary_floats) {}

  std::vector<float> queries;          // [kQueryBlock][dim]
  std::vector<float> probabilities;    // [kQueryBlock][kKeyTile]: scores, then exp2'd in place
  std::vector<float> accumulator;      // [kQueryBlock][dim], unnormalized out
  std::vector<float> row;              // [dim]: one row on its way to or from storage
  std::vector<float> keys_transposed;  // the item's key tiles, each [dim][kKeyTile]
  std::vector<float> values;           // the item's values, [key][dim]
  std::vector<float> rotary;           // RotaryRows' scratch (one position's cos and sin)
  float running_max[kQueryBlock] = {};  // base 2
  float running_sum[kQueryBlock] = {};
};

// Copies k_new/v_new into cache positions seqlens_k[b].. of every sequence;
// with a rotary embedding, k_new's rows rotated (and rounded once).
void append_to_cache(const Problem& problem) {
  const RowAddress address(problem);
  const RotaryRows rotary(problem);
  std::vector<float> row_values(rotary.enabled() ? problem.head_dim : 0), scratch(rotary.scratch_floats());
  for (int b = 0; b < problem.batch; ++b) {
    const int cached = problem.host_seqlens_k[b];
    for (int row = 0; row < problem.new_len; ++row) {
      for (int head_kv = 0; head_kv < problem.heads_kv; ++head_kv) {
        const std::int64_t new_row = address.appended(problem.k_new, b, row, head_kv);
        const std::int64_t cache_row = address.key(problem.k, b, cached + row, head_kv);
        if (rotary.enabled()) {
          load_row(problem.k_new, new_row, problem.head_dim, row_values.data());
          rotary.rotate_appended_key(row_values.data(), b, row, scratch.data());
          store_row(problem.k, cache_row, problem.head_dim, row_values.data());
        } else {
          copy_row(problem.k_new, new_row, problem.k, cache_row, problem.head_dim);
        }
        copy_row(problem.v_new, address.appended(problem.v_new, b, row, head_kv), problem.v,
                 address.key(problem.v, b, cached + row, head_kv), problem.head_dim);
      }
    }
  }
}

std::int64_t rows_cost(const ScoreModel& model, int b, int first_row, int end_row) {
  const ScoreRules rules = model.sequence_rules(b);
  std::int64_t cost = 0;
  for (int first = first_row; first < end_row; first += kQueryBlock) {
    const int end = std::min(end_row, first + kQueryBlock);
    const KeyRange keys = ScoreModel::rows_keys(rules, first, end);
    cost += (keys.empty() ? 0 : keys.last - keys.first + 1) * (end - first) + (end - first);
  }
  return cost;
}

// Runs of query blocks, as long as possible while leaving several items per
// thread (so uneven items still balance), heaviest first.
std::vector<WorkItem> list_work_items(const Problem& problem, const ScoreModel& model, int threads) {
  std::int64_t total_blocks = 0;
  for (int b = 0; b < problem.batch; ++b)
    total_blocks += static_cast<std::int64_t>((problem.q_len(b) + kQueryBlock - 1) / kQueryBlock) * problem.heads_kv;
  const std::int64_t items_wanted = 8 * static_cast<std::int64_t>(threads);
  const int rows_per_item = static_cast<int>(std::max<std::int64_t>(1, total_blocks / items_wanted)) * kQueryBlock;

  std::vector<WorkItem> items;
  for (int b = 0; b < problem.batch; ++b) {
    const int q_len = problem.q_len(b);
    for (int first_row = 0; first_row < q_len; first_row += rows_per_item) {
      const int end_row = static_cast<int>(std::min<std::int64_t>(q_len, static_cast<std::int64_t>(first_row) + rows_per_item));
      const std::int64_t cost = rows_cost(model, b, first_row, end_row);
      for (int head_kv = 0; head_kv < problem.heads_kv; ++head_kv)
        items.push_back({b, head_kv, first_row, end_row, cost});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const WorkItem& x, const WorkItem& y) { return x.cost > y.cost; });
  return items;
}

int max_key_tiles(const Problem& problem) {
  int longest = 0;
  for (int b = 0; b < problem.batch; ++b) longest = std::max(longest, problem.kv_len(b));
  return (longest + kKeyTile - 1) / kKeyTile;
}

class ForwardRunner {
 public:
  explicit ForwardRunner(const Problem& problem)
      : problem_(problem),
        address_(problem),
        model_(problem),
        rotary_(problem),
        dim_(padded_dim(problem.head_dim)) {}

  int dim() const { return dim_; }
  const ScoreModel& model() const { return model_; }
  const RotaryRows& rotary() const { return rotary_; }

  void run(const WorkItem& item, ForwardScratch& scratch) const {
    const int kv_first = problem_.kv_first(item.batch_index);
    const int kv_len = problem_.kv_len(item.batch_index);
    const KeyRange keys =
        ScoreModel::rows_keys(model_.sequence_rules(item.batch_index), item.first_row, item.end_row);
    // Tiles sit at multiples of kKeyTile, whatever the first visible key.
    const int first_tile = keys.empty() ? 0 : static_cast<int>(keys.first / kKeyTile);
    if (!keys.empty()) {
      const int first_key = first_tile * kKeyTile;
      const int key_count = (static_cast<int>(keys.last / kKeyTile) + 1 - first_tile) * kKeyTile;
      load_key_tiles_transposed(address_, problem_.k, item.batch_index, item.head_kv, first_key, key_count, kv_first,
                                kv_len, problem_.head_dim, dim_, kKeyTile, scratch.row.data(),
                                scratch.keys_transposed.data());
      load_key_rows(address_, problem_.v, item.batch_index, item.head_kv, first_key, key_count, kv_first, kv_len,
                    problem_.head_dim, dim_, scratch.values.data());
    }
    const int group = problem_.group_size();
    for (int head = item.head_kv * group; head < (item.head_kv + 1) * group; ++head)
      for (int first_row = item.first_row; first_row < item.end_row; first_row += kQueryBlock)
        run_block(item.batch_index, head, first_row, std::min(kQueryBlock, item.end_row - first_row), first_tile,
                  scratch);
  }

 private:
  void run_block(int b, int head, int first_row, int row_count, int first_loaded_tile,
                 ForwardScratch& scratch) const {
    const int kv_len = problem_.kv_len(b);
    const int rows_padded = round_up4(row_count);
    const ScoreRules rules = model_.rules(b, head);

    load_queries(b, head, first_row, row_count, scratch);
    std::fill(scratch.accumulator.begin(), scratch.accumulator.end(), 0.0f);
    std::fill(scratch.probabilities.begin(), scratch.probabilities.end(), 0.0f);
    // A sink starts every row's softmax: the maximum so far, contributing exp2(0) = 1.
    const float sink = model_.sink_log2e(head);
    std::fill_n(scratch.running_max, kQueryBlock, sink);
    std::fill_n(scratch.running_sum, kQueryBlock, sink == kNegInf ? 0.0f : 1.0f);

    const KeyRange keys = ScoreModel::rows_keys(rules, first_row, first_row + row_count);
    if (!keys.empty()) {
      for (int tile = static_cast<int>(keys.first / kKeyTile); tile <= keys.last / kKeyTile; ++tile) {
        const int first_key = tile * kKeyTile;
        const int key_count = std::min(kKeyTile, kv_len - first_key);
        const std::int64_t loaded_tile = tile - first_loaded_tile;
        const float* keys_transposed = &scratch.keys_transposed[loaded_tile * dim_ * kKeyTile];
        const float* values = &scratch.values[loaded_tile * kKeyTile * dim_];
        multiply_add<false>(scratch.queries.data(), dim_, keys_transposed, kKeyTile, scratch.probabilities.data(),
                            kKeyTile, rows_padded, (key_count + 7) / 8 * 8, dim_);
        for (int r = 0; r < row_count; ++r) {
          float* scores = &scratch.probabilities[r * kKeyTile];
          ScoreModel::finish_scores(scores, key_count, first_key, first_row + r, rules, nullptr);
          softmax_update(r, scores, key_count, scratch);
          // The sum above keeps every entry: dropout acts on normalized probabilities.
          model_.drop(scores, key_count, b, head, first_row + r, first_key);
        }
        multiply_add<true>(scratch.probabilities.data(), kKeyTile, values, dim_, scratch.accumulator.data(), dim_,
                           rows_padded, dim_, key_count);
      }
    }
    store_rows(b, head, first_row, row_count, scratch);
  }

  void load_queries(int b, int head, int first_row, int row_count, ForwardScratch& scratch) const {
    std::fill(scratch.queries.begin(), scratch.queries.end(), 0.0f);
    for (int r = 0; r < row_count; ++r) {
      float* query = &scratch.queries[r * dim_];
      load_row(problem_.q, address_.query(problem_.q, b, first_row + r, head), problem_.head_dim, query);
      if (rotary_.enabled()) rotary_.rotate_query(query, b, first_row + r, scratch.rotary.data());
    }
  }

  // Rescales row r's running state to the tile's maximum and replaces the
  // scores by their exp2. Until a row has seen a finite score its maximum is
  // -inf; 0 then serves as the reference so that no -inf - -inf appears.
  void softmax_update(int r, float* scores, int key_count, ForwardScratch& scratch) const {
    float tile_max = kNegInf;
    for (int j = 0; j < key_count; ++j) tile_max = std::max(tile_max, scores[j]);
    const float old_max = scratch.running_max[r];
    const float new_max = std::max(old_max, tile_max);
    const float reference = new_max == kNegInf ? 0.0f : new_max;
    exp2_shifted(scores, key_count, reference);
    const float tile_sum = sum_of(scores, key_count);
    const float correction = std::exp2(old_max - reference);
    if (correction != 1.0f) {
      float* accumulator = &scratch.accumulator[r * dim_];
      for (int d = 0; d < dim_; ++d) accumulator[d] *= correction;
    }
    scratch.running_sum[r] = scratch.running_sum[r] * correction + tile_sum;
    scratch.running_max[r] = new_max;
  }

  void store_rows(int b, int head, int first_row, int row_count, ForwardScratch& scratch) const {
    const bool write_lse = !problem_.lse.empty();
    const float dropout_scale = model_.dropout_scale();
    float* row = scratch.row.data();
    for (int r = 0; r < row_count; ++r) {
      const float sum = scratch.running_sum[r];
      const float* accumulator = &scratch.accumulator[r * dim_];
      // A row that saw no key and no sink (sum == 0) gets out = 0 and lse =
      // -inf; a sum of at least 1 otherwise (its maximum contributes exp2(0)).
      // With a sink and no key, the accumulator is 0: out = 0, lse = sink.
      const bool saw_keys = sum != 0.0f;
      for (int d = 0; d < problem_.head_dim; ++d) row[d] = saw_keys ? accumulator[d] / sum * dropout_scale : 0.0f;
      const int query_row = first_row + r;
      store_row(problem_.out, address_.query(problem_.out, b, query_row, head), problem_.head_dim, row);
      if (write_lse) {
        const float lse = saw_keys ? (scratch.running_max[r] + std::log2(sum)) * kLn2 : kNegInf;
        store_f32(problem_.lse, address_.lse(problem_.lse, b, query_row, head), lse);
      }
    }
  }

  const Problem& problem_;
  RowAddress address_;
  ScoreModel model_;
  RotaryRows rotary_;
  int dim_;
};

}  // namespace

void run_forward(const Problem& problem) {
  if (problem.layout == Layout::kv_cache && problem.new_len > 0) append_to_cache(problem);

  const ForwardRunner runner(problem);
  const std::vector<WorkItem> items = list_work_items(problem, runner.model(), configured_thread_count());
  const std::int64_t item_count = static_cast<std::int64_t>(items.size());
  std::vector<ForwardScratch> scratch;
  const int workers = worker_count(item_count);
  scratch.reserve(workers);
  for (int worker = 0; worker < workers; ++worker)
    scratch.emplace_back(runner.dim(), max_key_tiles(problem), runner.rotary().scratch_floats());
  parallel_for(item_count, [&](std::int64_t item, int worker) { runner.run(items[item], scratch[worker]); });
  if (!problem.attn_probs.empty()) write_attention_probabilities(problem);
}

// One row at a time, every score materialized: a debug output, kept simple.
void write_attention_probabilities(const Problem& problem) {
  const RowAddress address(problem);
  const ScoreModel model(problem);
  const RotaryRows rotary(problem);
  const TensorView& probs = problem.attn_probs;
  auto* base = static_cast<float*>(probs.data);
  const int dim = problem.head_dim;
  const std::int64_t items = static_cast<std::int64_t>(problem.batch) * problem.heads_q;
  parallel_for(items, [&](std::int64_t item, int) {
    const int b = static_cast<int>(item / problem.heads_q);
    const int head = static_cast<int>(item % problem.heads_q);
    const int head_kv = head / problem.group_size();
    const int q_len = problem.q_len(b);
    const int kv_len = problem.kv_len(b);
    std::vector<float> query(dim), key(dim), scores(std::max(kv_len, 1)), rotary_scratch(rotary.scratch_floats());
    auto at = [&](std::int64_t i, std::int64_t j) {
      return base + b * probs.strides[0] + head * probs.strides[1] + i * probs.strides[2] + j * probs.strides[3];
    };
    for (std::int64_t i = 0; i < problem.max_q_len; ++i)
      for (std::int64_t j = 0; j < problem.probs_kv_len; ++j) *at(i, j) = 0.0f;
    const ScoreRules rules = model.rules(b, head);
    const float sink = model.sink_log2e(head);
    for (int i = 0; i < q_len; ++i) {
      load_row(problem.q, address.query(problem.q, b, i, head), dim, query.data());
      if (rotary.enabled()) rotary.rotate_query(query.data(), b, i, rotary_scratch.data());
      for (int j = 0; j < kv_len; ++j) {
        load_row(problem.k, address.key(problem.k, b, j, head_kv), dim, key.data());
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) dot += query[d] * key[d];
        scores[j] = dot;
      }
      // Keys before kv_first (a leftpad's rows, whatever they hold) become -inf here.
      ScoreModel::finish_scores(scores.data(), kv_len, 0, i, rules, nullptr);
      float max_score = sink;
      for (int j = 0; j < kv_len; ++j) max_score = std::max(max_score, scores[j]);
      // No key and no sink: every p_ij is 0 (the sign still carries the mask).
      const double reference = max_score == kNegInf ? 0.0 : max_score;
      double sum = sink == kNegInf ? 0.0 : std::exp2(static_cast<double>(sink) - reference);
      for (int j = 0; j < kv_len; ++j) sum += std::exp2(static_cast<double>(scores[j]) - reference);
      for (int j = 0; j < kv_len; ++j) {
        const double weight = std::exp2(static_cast<double>(scores[j]) - reference);
        const float p = weight == 0.0 ? 0.0f : static_cast<float>(weight / sum);
        const bool kept = dropout_keeps(problem.dropout, b, head, problem.heads_q, i, j);
        *at(i, j) = kept ? p : -p;
      }
    }
  });
}

}  // namespace cuflash::detail::cpu
