// What `cuflash bench` was asked to measure: lists of passes, head dims,
// masks and sequence lengths whose every combination is timed on each listed
// backend; or, in decode mode, lists of batches, cache lengths, head counts
// and page sizes of a KV-cache forward. Filled from the command line by
// parse_bench_flags().
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
// prefill: dense q, k, v of one length. decode: q_len queries per sequence
// against a KV cache (contiguous or paged) of kv_len keys, no append.
enum class BenchMode { prefill, decode };
// --sweep: which sweep's lists fill what no other flag gave.
enum class BenchSweep { none, prefill, decode };

struct HeadPair {
  int q = 0, kv = 0;  // query heads, key/value heads
};

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

  BenchMode mode = BenchMode::prefill;
  BenchSweep sweep = BenchSweep::none;
  // Decode mode: every combination of these (and of head_dims, masks).
  std::vector<int> batches = {1};
  std::vector<int> kv_lens = {4096};
  std::vector<HeadPair> head_pairs = {{32, 8}};
  std::vector<int> page_sizes = {16};  // 0: a contiguous cache [B, kv_len, Hk, D]
  int q_len = 1;

  double warmup_ms = 25.0;  // at least 3 calls
  double rep_ms = 300.0;    // timed calls per point: about this much GPU time ...
  int min_reps = 10;        // ... within these bounds
  int max_reps = 1000;
  int reps = 0;             // > 0: exactly this many timed calls
  bool flush_l2 = true;
  bool shuffle_pages = true;  // decode: block tables a random permutation of the pages
  bool json = false;
  std::uint64_t seed = 0;
};

// One point of the product of the lists, with its batch and heads resolved.
// Decode points: seqlen is q_len and heads the query heads.
struct BenchPoint {
  BenchPass pass;
  int head_dim, heads, batch, seqlen;
  bool causal;
  bool decode = false;
  int heads_kv = 0, kv_len = 0, page_size = 0;  // decode only
  // 4*B*H*S*S*D, halved when causal, x3.5 for forward+backward;
  // decode: 4*B*Hq*q_len*kv_len*D.
  double flops() const;
  // Decode: bytes of K and V the call must read, 2*B*kv_len*Hk*D*2 (f16/bf16).
  double kv_bytes() const;
};

// In the order they run: pass, head dim, mask, seqlen (innermost); decode:
// head dim, mask, heads, page size, batch, kv_len (innermost).
std::vector<BenchPoint> bench_points(const BenchConfig& config);

using BenchParse = FlagParse;

// --sweep prefill (or decode) fills the lists that no other flag gives, in any order.
BenchParse parse_bench_flags(const std::vector<std::string_view>& args, BenchConfig* config);

void print_bench_help(std::FILE* stream);

}  // namespace cuflash::tool
