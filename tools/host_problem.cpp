#include "host_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace cuflash::tool {

using host::HostTensor;

namespace {

int uniform(std::mt19937_64& engine, int lo, int hi) {
  return std::uniform_int_distribution<int>(lo, hi)(engine);
}

std::vector<std::int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<std::int32_t> sums(lengths.size() + 1, 0);
  std::partial_sum(lengths.begin(), lengths.end(), sums.begin() + 1);
  return sums;
}

// Sequence 0 gets the longest lengths so that the flags' maxima are reached.
void draw_lengths(const RunConfig& config, std::mt19937_64& engine, HostProblem* problem) {
  const int batch = config.batch;
  problem->q_lens.assign(batch, config.seqlen_q);
  problem->kv_lens.assign(batch, config.seqlen_k);
  if (config.layout == InputLayout::varlen) {
    // Equal flags mean self-attention packing: each sequence's q and k lengths agree.
    for (int b = 1; b < batch; ++b) {
      problem->q_lens[b] = uniform(engine, 1, config.seqlen_q);
      problem->kv_lens[b] = config.seqlen_q == config.seqlen_k ? problem->q_lens[b] : uniform(engine, 1, config.seqlen_k);
    }
  } else if (config.layout == InputLayout::paged) {
    const int max_cached = config.seqlen_k - config.append;
    for (int b = 1; b < batch; ++b)
      problem->kv_lens[b] = uniform(engine, std::min(1, max_cached), max_cached) + config.append;
  }
  problem->max_q_len = *std::max_element(problem->q_lens.begin(), problem->q_lens.end());
  problem->max_kv_len = *std::max_element(problem->kv_lens.begin(), problem->kv_lens.end());
}

// Standard normal values, drawn as float from the 64-bit engine: a seed gives
// the same problem as it always has.
void fill_normal(HostTensor& tensor, std::mt19937_64& engine) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) tensor.set(i, normal(engine));
}

// Writes k_new/v_new rows into the cache copies at positions seqlens_k[b]..,
// through the block table: the forward's append, done independently here.
void apply_append(const RunConfig& config, HostProblem* problem) {
  problem->k_after = problem->tensors[kK];
  problem->v_after = problem->tensors[kV];
  if (config.append == 0) return;
  const std::size_t row_bytes = static_cast<std::size_t>(config.heads_kv) * config.head_dim * dtype_size(config.dtype);
  const HostTensor& cached = problem->tensors[kSeqlensK];
  const HostTensor& block_table = problem->tensors[kBlockTable];
  for (int b = 0; b < config.batch; ++b) {
    for (int j = 0; j < config.append; ++j) {
      const int position = static_cast<int>(cached.get(b)) + j;
      const auto page =
          static_cast<std::int64_t>(block_table.get(b * problem->max_pages + position / config.page_size));
      const std::int64_t cache_row = page * config.page_size + position % config.page_size;
      const std::int64_t new_row = static_cast<std::int64_t>(b) * config.append + j;
      std::memcpy(problem->k_after.bytes().data() + cache_row * row_bytes,
                  problem->tensors[kKNew].bytes().data() + new_row * row_bytes, row_bytes);
      std::memcpy(problem->v_after.bytes().data() + cache_row * row_bytes,
                  problem->tensors[kVNew].bytes().data() + new_row * row_bytes, row_bytes);
    }
  }
}

}  // namespace

HostProblem build_problem(const RunConfig& config) {
  HostProblem problem;
  std::mt19937_64 engine(config.seed);
  draw_lengths(config, engine, &problem);
  auto& t = problem.tensors;
  const std::int64_t batch = config.batch, heads_q = config.heads_q, heads_kv = config.heads_kv,
                     head_dim = config.head_dim;
  const DType dtype = config.dtype;

  switch (config.layout) {
    case InputLayout::dense:
      t[kQ] = HostTensor(dtype, {batch, config.seqlen_q, heads_q, head_dim});
      t[kK] = HostTensor(dtype, {batch, config.seqlen_k, heads_kv, head_dim});
      t[kLse] = HostTensor(DType::f32, {batch, heads_q, config.seqlen_q});
      break;
    case InputLayout::varlen: {
      const std::vector<std::int32_t> cu_q = prefix_sums(problem.q_lens), cu_k = prefix_sums(problem.kv_lens);
      t[kQ] = HostTensor(dtype, {cu_q.back(), heads_q, head_dim});
      t[kK] = HostTensor(dtype, {cu_k.back(), heads_kv, head_dim});
      t[kLse] = HostTensor(DType::f32, {heads_q, cu_q.back()});
      t[kCuSeqlensQ] = HostTensor::from_i32(cu_q, {batch + 1});
      t[kCuSeqlensK] = HostTensor::from_i32(cu_k, {batch + 1});
      break;
    }
    case InputLayout::paged: {
      problem.max_pages = (config.seqlen_k + config.page_size - 1) / config.page_size;
      problem.num_pages = config.batch * problem.max_pages;
      std::vector<std::int32_t> pages(problem.num_pages);
      std::iota(pages.begin(), pages.end(), 0);
      std::shuffle(pages.begin(), pages.end(), engine);
      std::vector<std::int32_t> cached(config.batch), after(config.batch);
      for (int b = 0; b < config.batch; ++b) {
        cached[b] = problem.kv_lens[b] - config.append;
        after[b] = problem.kv_lens[b];
      }
      t[kQ] = HostTensor(dtype, {batch, config.seqlen_q, heads_q, head_dim});
      t[kK] = HostTensor(dtype, {problem.num_pages, config.page_size, heads_kv, head_dim});
      t[kLse] = HostTensor(DType::f32, {batch, heads_q, config.seqlen_q});
      t[kBlockTable] = HostTensor::from_i32(pages, {batch, problem.max_pages});
      t[kSeqlensK] = HostTensor::from_i32(cached, {batch});
      t[kSeqlensKAfter] = HostTensor::from_i32(after, {batch});
      if (config.append > 0) {
        t[kKNew] = HostTensor(dtype, {batch, config.append, heads_kv, head_dim});
        t[kVNew] = t[kKNew];
      }
      break;
    }
  }
  t[kV] = t[kK];
  t[kOut] = t[kQ];
  for (Slot slot : {kQ, kK, kV, kKNew, kVNew}) fill_normal(t[slot], engine);
  if (config.backward) {
    t[kDout] = t[kQ];
    fill_normal(t[kDout], engine);
    t[kDq] = t[kQ];
    t[kDk] = t[kK];
    t[kDv] = t[kK];
  }
  if (config.alibi) {
    t[kAlibi] = HostTensor(DType::f32, {heads_q});
    for (std::int64_t h = 0; h < heads_q; ++h)
      t[kAlibi].set(h, std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(heads_q)));
  }
  apply_append(config, &problem);

  double pairs = 0.0;
  for (int b = 0; b < config.batch; ++b) pairs += static_cast<double>(problem.q_lens[b]) * problem.kv_lens[b];
  problem.forward_flops = 4.0 * heads_q * head_dim * pairs * (config.causal ? 0.5 : 1.0);
  return problem;
}

std::string HostProblem::describe_layout(const RunConfig& config) const {
  const auto range = [](const std::vector<int>& lengths) {
    const auto [lo, hi] = std::minmax_element(lengths.begin(), lengths.end());
    return std::to_string(*lo) + ".." + std::to_string(*hi);
  };
  switch (config.layout) {
    case InputLayout::dense:
      return "dense (q [B,Sq,Hq,D], k/v [B,Sk,Hk,D], contiguous)";
    case InputLayout::varlen:
      return "varlen (packed: total_q=" + std::to_string(tensors[kQ].shape()[0]) +
             " total_k=" + std::to_string(tensors[kK].shape()[0]) + ", q lengths " + range(q_lens) +
             ", k lengths " + range(kv_lens) + ")";
    case InputLayout::paged: {
      std::vector<int> cached(kv_lens);
      for (int& length : cached) length -= config.append;
      return "paged KV cache (" + std::to_string(num_pages) + " pages of " + std::to_string(config.page_size) +
             ", shuffled block table [B," + std::to_string(max_pages) + "], cached keys " + range(cached) +
             ", append " + std::to_string(config.append) + ")";
    }
  }
  return {};
}

Views host_views(const HostProblem& problem) {
  Views views;
  for (std::size_t slot = 0; slot < kSlotCount; ++slot) views[slot] = problem.tensors[slot].view();
  return views;
}

namespace {

// The arguments the forward and the backward share: q, k, v, out, lse, alibi
// slopes and the varlen batch.
template <typename Args>
Args shared_args(const Views& views, const HostProblem& problem) {
  Args args;
  args.q = views[kQ];
  args.k = views[kK];
  args.v = views[kV];
  args.out = views[kOut];
  args.lse = views[kLse];
  args.alibi_slopes = views[kAlibi];
  args.varlen = {views[kCuSeqlensQ], views[kCuSeqlensK], problem.max_q_len, problem.max_kv_len};
  if (!args.varlen.given()) args.varlen = {};
  return args;
}

}  // namespace

ForwardArgs forward_args(const Views& views, const HostProblem& problem) {
  ForwardArgs args = shared_args<ForwardArgs>(views, problem);
  args.kv_cache = {views[kSeqlensK], views[kBlockTable], views[kKNew], views[kVNew]};
  return args;
}

BackwardArgs backward_args(const Views& views, const HostProblem& problem) {
  BackwardArgs args = shared_args<BackwardArgs>(views, problem);
  args.dout = views[kDout];
  args.dq = views[kDq];
  args.dk = views[kDk];
  args.dv = views[kDv];
  args.kv_cache = {views[kSeqlensKAfter], views[kBlockTable], {}, {}};
  return args;
}

AttentionOptions attention_options(const RunConfig& config, Backend backend) {
  AttentionOptions options;
  options.softmax_scale = config.scale;
  options.causal = config.causal;
  options.window_left = config.window_left;
  options.window_right = config.window_right;
  options.softcap = config.softcap;
  options.deterministic = config.deterministic;
  options.backend = backend;
  return options;
}

}  // namespace cuflash::tool
