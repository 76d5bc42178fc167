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
SequenceLengths draw_lengths(const RunConfig& config, std::mt19937_64& engine) {
  const int batch = config.batch;
  SequenceLengths lengths;
  lengths.q.assign(batch, config.seqlen_q);
  lengths.kv.assign(batch, config.seqlen_k);
  if (config.layout == InputLayout::varlen) {
    // Equal flags mean self-attention packing: each sequence's q and k lengths agree.
    for (int b = 1; b < batch; ++b) {
      lengths.q[b] = uniform(engine, 1, config.seqlen_q);
      lengths.kv[b] = config.seqlen_q == config.seqlen_k ? lengths.q[b] : uniform(engine, 1, config.seqlen_k);
    }
  } else if (config.layout == InputLayout::paged) {
    const int max_cached = config.seqlen_k - config.append;
    for (int b = 1; b < batch; ++b)
      lengths.kv[b] = uniform(engine, std::min(1, max_cached), max_cached) + config.append;
  }
  return lengths;
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

double TensorShape::elements() const {
  if (dims.empty()) return 0.0;
  double product = 1.0;
  for (std::int64_t dim : dims) product *= static_cast<double>(dim);
  return product;
}

double TensorShape::bytes() const { return elements() * static_cast<double>(dtype_size(dtype)); }

std::int64_t SequenceLengths::total_q() const { return std::accumulate(q.begin(), q.end(), std::int64_t{0}); }
std::int64_t SequenceLengths::total_kv() const { return std::accumulate(kv.begin(), kv.end(), std::int64_t{0}); }

SequenceLengths draw_lengths(const RunConfig& config) {
  std::mt19937_64 engine(config.seed);
  return draw_lengths(config, engine);
}

ProblemShapes problem_shapes(const RunConfig& config, std::int64_t total_q, std::int64_t total_k) {
  ProblemShapes s;
  const std::int64_t batch = config.batch, heads_q = config.heads_q, heads_kv = config.heads_kv,
                     head_dim = config.head_dim;
  const DType dtype = config.dtype;
  const auto index = [](std::vector<std::int64_t> dims) { return TensorShape{DType::i32, std::move(dims)}; };

  switch (config.layout) {
    case InputLayout::dense:
      s[kQ] = {dtype, {batch, config.seqlen_q, heads_q, head_dim}};
      s[kK] = {dtype, {batch, config.seqlen_k, heads_kv, head_dim}};
      s[kLse] = {DType::f32, {batch, heads_q, config.seqlen_q}};
      break;
    case InputLayout::varlen:
      s[kQ] = {dtype, {total_q, heads_q, head_dim}};
      s[kK] = {dtype, {total_k, heads_kv, head_dim}};
      s[kLse] = {DType::f32, {heads_q, total_q}};
      s[kCuSeqlensQ] = s[kCuSeqlensK] = index({batch + 1});
      break;
    case InputLayout::paged: {
      const std::int64_t max_pages = (std::int64_t{config.seqlen_k} + config.page_size - 1) / config.page_size;
      s[kQ] = {dtype, {batch, config.seqlen_q, heads_q, head_dim}};
      s[kK] = {dtype, {batch * max_pages, config.page_size, heads_kv, head_dim}};
      s[kLse] = {DType::f32, {batch, heads_q, config.seqlen_q}};
      s[kBlockTable] = index({batch, max_pages});
      s[kSeqlensK] = s[kSeqlensKAfter] = index({batch});
      if (config.append > 0) s[kKNew] = s[kVNew] = {dtype, {batch, config.append, heads_kv, head_dim}};
      break;
    }
  }
  s[kV] = s[kK];
  s[kOut] = s[kQ];
  if (config.backward) {
    s[kDout] = s[kDq] = s[kQ];
    s[kDk] = s[kDv] = s[kK];
  }
  if (config.alibi) s[kAlibi] = {DType::f32, {heads_q}};
  return s;
}

HostProblem build_problem(const RunConfig& config) {
  HostProblem problem;
  std::mt19937_64 engine(config.seed);
  SequenceLengths lengths = draw_lengths(config, engine);
  const ProblemShapes shapes = problem_shapes(config, lengths.total_q(), lengths.total_kv());
  problem.q_lens = std::move(lengths.q);
  problem.kv_lens = std::move(lengths.kv);
  problem.max_q_len = *std::max_element(problem.q_lens.begin(), problem.q_lens.end());
  problem.max_kv_len = *std::max_element(problem.kv_lens.begin(), problem.kv_lens.end());
  auto& t = problem.tensors;
  for (std::size_t slot = 0; slot < kSlotCount; ++slot)
    if (!shapes[slot].dims.empty() && shapes[slot].dtype != DType::i32)
      t[slot] = HostTensor(shapes[slot].dtype, shapes[slot].dims);
  const std::int64_t batch = config.batch, heads_q = config.heads_q, head_dim = config.head_dim;

  if (config.layout == InputLayout::varlen) {
    t[kCuSeqlensQ] = HostTensor::from_i32(prefix_sums(problem.q_lens), {batch + 1});
    t[kCuSeqlensK] = HostTensor::from_i32(prefix_sums(problem.kv_lens), {batch + 1});
  } else if (config.layout == InputLayout::paged) {
    problem.max_pages = static_cast<int>(shapes[kBlockTable].dims[1]);
    problem.num_pages = static_cast<int>(shapes[kK].dims[0]);
    std::vector<std::int32_t> pages(problem.num_pages);
    std::iota(pages.begin(), pages.end(), 0);
    std::shuffle(pages.begin(), pages.end(), engine);
    std::vector<std::int32_t> cached(config.batch), after(config.batch);
    for (int b = 0; b < config.batch; ++b) {
      cached[b] = problem.kv_lens[b] - config.append;
      after[b] = problem.kv_lens[b];
    }
    t[kBlockTable] = HostTensor::from_i32(pages, {batch, problem.max_pages});
    t[kSeqlensK] = HostTensor::from_i32(cached, {batch});
    t[kSeqlensKAfter] = HostTensor::from_i32(after, {batch});
  }
  for (Slot slot : {kQ, kK, kV, kKNew, kVNew}) fill_normal(t[slot], engine);
  if (config.backward) fill_normal(t[kDout], engine);
  if (config.alibi) {
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
