// What `cuflash bench` was asked to measure: lists of passes, head dims,
// masks and sequence lengths whose every combination is timed on each listed
// backend. Filled from the command line by parse_bench_flags().
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "cuflash/options.hpp"
#include "cuflash/tensor.hpp"
#include "flag_table.hpp"

namespace cuflash::tool {

enum class BenchPass { fwd, fwdbwd };

const char* bench_pass_name(BenchPass pass);

struct BenchConfig {
  std::vector<Backend> backends = {Backend::cuda};
  std::vector<BenchPass> passes = {BenchPass::fwd};
  std::vector<int> head_dims = {128};
  std::vector<bool> masks = {false};  // causal or not
  std::vector<int> seqlens = {4096};
  int heads = 0;         // 0: hidden / head_dim
  int batch = 0;         // 0: tokens / seqlen
  int hidden = 2048;     // heads * head_dim when --heads is not given
  int tokens = 16384;    // batch * seqlen when --batch is not given
  DType dtype = DType::bf16;
  bool deterministic = false;

  double warmup_ms = 25.0;  // at least 3 calls
  double rep_ms = 300.0;    // timed calls per point: about this much GPU time ...
  int min_reps = 10;        // ... within these bounds
  int max_reps = 1000;
  int reps = 0;             // > 0: exactly this many timed calls
  bool flush_l2 = true;
  bool json = false;
  std::uint64_t seed = 0;
};

// One point of the product of the lists, with its batch and heads resolved.
struct BenchPoint {
  BenchPass pass;
  int head_dim, heads, batch, seqlen;
  bool causal;
  // 4*B*H*S*S*D, halved when causal, x3.5 for forward+backward.
  double flops() const;
};

// In the order they run: pass, head dim, mask, seqlen (innermost).
std::vector<BenchPoint> bench_points(const BenchConfig& config);

using BenchParse = FlagParse;

// --sweep prefill fills the lists that no other flag gives, in any order.
BenchParse parse_bench_flags(const std::vector<std::string_view>& args, BenchConfig* config);

void print_bench_help(std::FILE* stream);

}  // namespace cuflash::tool
