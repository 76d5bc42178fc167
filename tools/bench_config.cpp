#include "bench_config.hpp"

#include <charconv>
#include <cmath>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>

namespace cuflash::tool {

const char* bench_pass_name(BenchPass pass) { return pass == BenchPass::fwd ? "fwd" : "fwdbwd"; }

double BenchPoint::flops() const {
  if (decode) return 4.0 * batch * heads * static_cast<double>(seqlen) * kv_len * head_dim;
  double count = 4.0 * batch * heads * static_cast<double>(seqlen) * seqlen * head_dim;
  if (causal) count /= 2.0;
  if (pass == BenchPass::fwdbwd) count *= 3.5;
  return count;
}

double BenchPoint::kv_bytes() const {
  return decode ? 2.0 * batch * static_cast<double>(kv_len) * heads_kv * head_dim * 2.0 : 0.0;
}

std::vector<BenchPoint> bench_points(const BenchConfig& config) {
  std::vector<BenchPoint> points;
  if (config.mode == BenchMode::decode) {
    for (int head_dim : config.head_dims)
      for (bool causal : config.masks)
        for (const HeadPair& heads : config.head_pairs)
          for (int page_size : config.page_sizes)
            for (int batch : config.batches)
              for (int kv_len : config.kv_lens) {
                BenchPoint p{BenchPass::fwd, head_dim, heads.q, batch, config.q_len, causal};
                p.decode = true;
                p.heads_kv = heads.kv;
                p.kv_len = kv_len;
                p.page_size = page_size;
                points.push_back(p);
              }
    return points;
  }
  for (BenchPass pass : config.passes)
    for (int head_dim : config.head_dims)
      for (bool causal : config.masks)
        for (int seqlen : config.seqlens) {
          const int heads = config.heads > 0 ? config.heads : config.hidden / head_dim;
          const int batch = config.batch > 0 ? config.batch : config.tokens / seqlen;
          points.push_back({pass, head_dim, heads, batch, seqlen, causal});
        }
  return points;
}

namespace {

using Setter = FlagSetter<BenchConfig>;

Setter int_list_flag(std::vector<int> BenchConfig::*field, int minimum) {
  return [field, minimum](BenchConfig& config, std::string_view text) -> std::string {
    std::vector<int> values;
    for (std::string_view item : split_list(text)) {
      int value = 0;
      if (std::string error = parse_int(item, minimum, &value); !error.empty()) return error;
      values.push_back(value);
    }
    config.*field = std::move(values);
    return {};
  };
}

Setter ms_flag(double BenchConfig::*field) {
  return [field](BenchConfig& config, std::string_view text) -> std::string {
    double value = 0.0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(value) || value < 0.0)
      return "expected a number of milliseconds >= 0, got '" + std::string(text) + "'";
    config.*field = value;
    return {};
  };
}

// A comma-separated list of names out of `choices`; anything else is an error that lists them.
template <typename Value>
Setter choice_list_flag(std::vector<Value> BenchConfig::*field, std::vector<std::pair<std::string_view, Value>> choices) {
  return [field, choices](BenchConfig& config, std::string_view text) -> std::string {
    std::vector<Value> values;
    for (std::string_view item : split_list(text)) {
      bool found = false;
      for (const auto& [name, value] : choices)
        if (item == name) {
          values.push_back(value);
          found = true;
        }
      if (found) continue;
      return "expected a comma-separated list of " + choice_names(choices) + ", got '" + std::string(item) + "'";
    }
    config.*field = std::move(values);
    return {};
  };
}

const std::vector<Flag<BenchConfig>>& flags() {
  static const std::vector<Flag<BenchConfig>> table = {
      {"--sweep", "prefill|decode", "none",
       "prefill: the papers' sweep, fwd,fwdbwd x D 64,128 x none,causal x seqlen 512..16384; decode: issue 5's,"
       " D 128 x 32/8,32/32 x page 0,16,64 x batch 1,8,64,128 x kv_len 1k..128k (other flags narrow either)",
       // Applied after all flags (apply_*_sweep), whatever their order.
       [](BenchConfig& config, std::string_view text) -> std::string {
         if (text == "prefill") config.sweep = BenchSweep::prefill;
         else if (text == "decode") config.sweep = BenchSweep::decode;
         else return "expected prefill or decode, got '" + std::string(text) + "'";
         return {};
       }},
      {"--mode", "prefill|decode", "prefill",
       "prefill: dense q, k, v (--seqlen); decode: --q-len queries against a KV cache of --kv-len keys",
       choice_flag<BenchConfig, BenchMode>(&BenchConfig::mode,
                                           {{"prefill", BenchMode::prefill}, {"decode", BenchMode::decode}})},
      {"--batches", "LIST", "1", "decode: sequences per call, comma-separated", int_list_flag(&BenchConfig::batches, 1)},
      {"--kv-len", "LIST", "4096", "decode: keys in each sequence's cache, comma-separated",
       int_list_flag(&BenchConfig::kv_lens, 1)},
      {"--gqa", "LIST", "32/8", "decode: query heads/kv heads pairs, comma-separated (32/32 is MHA)",
       [](BenchConfig& config, std::string_view text) -> std::string {
         std::vector<HeadPair> pairs;
         for (std::string_view item : split_list(text)) {
           const std::size_t slash = item.find('/');
           HeadPair pair;
           if (slash == std::string_view::npos) return "expected HQ/HK pairs like 32/8, got '" + std::string(item) + "'";
           if (std::string error = parse_int(item.substr(0, slash), 1, &pair.q); !error.empty()) return error;
           if (std::string error = parse_int(item.substr(slash + 1), 1, &pair.kv); !error.empty()) return error;
           if (pair.q % pair.kv != 0)
             return "query heads must be a multiple of kv heads, got '" + std::string(item) + "'";
           pairs.push_back(pair);
         }
         config.head_pairs = std::move(pairs);
         return {};
       }},
      {"--page-size", "LIST", "16", "decode: keys per cache page, comma-separated; 0: a contiguous cache",
       int_list_flag(&BenchConfig::page_sizes, 0)},
      {"--q-len", "N", "1", "decode: queries per sequence", int_flag(&BenchConfig::q_len, 1)},
      {"--backend", "LIST", "cuda", "cuda, cudnn or auto, comma-separated",
       choice_list_flag<Backend>(&BenchConfig::backends,
                                 {{"cuda", Backend::cuda}, {"cudnn", Backend::cudnn}, {"auto", Backend::automatic}})},
      {"--pass", "LIST", "fwd", "fwd (forward) or fwdbwd (forward then backward), comma-separated",
       choice_list_flag<BenchPass>(&BenchConfig::passes, {{"fwd", BenchPass::fwd}, {"fwdbwd", BenchPass::fwdbwd}})},
      {"--head-dim", "LIST", "128", "head dimensions, comma-separated", int_list_flag(&BenchConfig::head_dims, 1)},
      {"--mask", "LIST", "none", "none or causal, comma-separated",
       choice_list_flag<bool>(&BenchConfig::masks, {{"none", false}, {"causal", true}})},
      {"--causal", nullptr, "off", "the same as --mask causal",
       [](BenchConfig& config, std::string_view) {
         config.masks = {true};
         return std::string();
       }},
      {"--seqlen", "LIST", "4096", "sequence lengths (queries = keys), comma-separated",
       int_list_flag(&BenchConfig::seqlens, 1)},
      {"--heads", "N", "hidden/head-dim", "heads (queries = keys/values)", int_flag(&BenchConfig::heads, 1)},
      {"--batch", "N", "tokens/seqlen", "sequences", int_flag(&BenchConfig::batch, 1)},
      {"--hidden", "N", "2048", "heads x head-dim, when --heads is not given", int_flag(&BenchConfig::hidden, 1)},
      {"--tokens", "N", "16384", "batch x seqlen, when --batch is not given", int_flag(&BenchConfig::tokens, 1)},
      {"--dtype", "bf16|f16", "bf16", "dtype of q, k, v, out and the gradients",
       [](BenchConfig& config, std::string_view text) -> std::string {
         if (text == "bf16") config.dtype = DType::bf16;
         else if (text == "f16") config.dtype = DType::f16;
         else return "expected bf16 or f16, got '" + std::string(text) + "'";
         return {};
       }},
      {"--deterministic", nullptr, "off", "ask for a deterministic backward",
       switch_flag(&BenchConfig::deterministic, true)},
      {"--warmup-ms", "X", "25", "untimed calls first, for this much GPU time (and at least 3 calls)",
       ms_flag(&BenchConfig::warmup_ms)},
      {"--rep-ms", "X", "300", "timed calls per point: about this much GPU time, within --min-reps..--max-reps",
       ms_flag(&BenchConfig::rep_ms)},
      {"--min-reps", "N", "10", "fewest timed calls per point", int_flag(&BenchConfig::min_reps, 1)},
      {"--max-reps", "N", "1000", "most timed calls per point", int_flag(&BenchConfig::max_reps, 1)},
      {"--reps", "N", "0", "exactly N timed calls per point (0: from --rep-ms)", int_flag(&BenchConfig::reps, 0)},
      {"--no-flush-l2", nullptr, "flush", "do not overwrite the L2 cache before each timed call",
       switch_flag(&BenchConfig::flush_l2, false)},
      {"--ordered-pages", nullptr, "shuffled", "decode: block tables in page order (sequence b's pages consecutive)",
       switch_flag(&BenchConfig::shuffle_pages, false)},
      {"--seed", "N", "0", "seed of the random inputs",
       [](BenchConfig& config, std::string_view text) {
         return parse_int<std::uint64_t>(text, 0, &config.seed);
       }},
      {"--json", nullptr, "off", "one JSON object per point on stdout, nothing else",
       switch_flag(&BenchConfig::json, true)},
      {"--help", nullptr, "", "print this help", nullptr},
  };
  return table;
}

// Applies the prefill sweep's lists where no flag gave one.
void apply_prefill_sweep(const std::set<std::string_view>& given, BenchConfig* config) {
  if (!given.contains("--pass")) config->passes = {BenchPass::fwd, BenchPass::fwdbwd};
  if (!given.contains("--head-dim")) config->head_dims = {64, 128};
  if (!given.contains("--mask") && !given.contains("--causal")) config->masks = {false, true};
  if (!given.contains("--seqlen")) config->seqlens = {512, 1024, 2048, 4096, 8192, 16384};
}

// Applies the decode sweep's lists where no flag gave one.
void apply_decode_sweep(const std::set<std::string_view>& given, BenchConfig* config) {
  config->mode = BenchMode::decode;
  if (!given.contains("--head-dim")) config->head_dims = {128};
  if (!given.contains("--gqa")) config->head_pairs = {{32, 8}, {32, 32}};
  if (!given.contains("--page-size")) config->page_sizes = {0, 16, 64};
  if (!given.contains("--batches")) config->batches = {1, 8, 64, 128};
  if (!given.contains("--kv-len")) config->kv_lens = {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072};
}

// What the flags cannot say one at a time: batch and heads must come out whole.
std::string check_combination(const BenchConfig& config) {
  if (config.min_reps > config.max_reps)
    return "--min-reps: must be <= --max-reps (" + std::to_string(config.max_reps) + "), got " +
           std::to_string(config.min_reps);
  if (config.mode == BenchMode::decode) {
    for (BenchPass pass : config.passes)
      if (pass != BenchPass::fwd) return "--pass: decode mode times the forward only, got fwdbwd";
    return {};
  }
  if (config.heads == 0)
    for (int head_dim : config.head_dims)
      if (config.hidden % head_dim != 0)
        return "--head-dim: " + std::to_string(head_dim) + " does not divide --hidden " +
               std::to_string(config.hidden) + " (give --heads)";
  if (config.batch == 0)
    for (int seqlen : config.seqlens)
      if (config.tokens % seqlen != 0)
        return "--seqlen: " + std::to_string(seqlen) + " does not divide --tokens " + std::to_string(config.tokens) +
               " (give --batch)";
  return {};
}

}  // namespace

BenchParse parse_bench_flags(const std::vector<std::string_view>& args, BenchConfig* config) {
  std::set<std::string_view> given;
  BenchParse parsed = parse_flags(args, flags(), "bench", config, &given);
  if (parsed.kind != BenchParse::Kind::run) return parsed;
  if (config->sweep == BenchSweep::prefill) apply_prefill_sweep(given, config);
  if (config->sweep == BenchSweep::decode) apply_decode_sweep(given, config);
  if (std::string error = check_combination(*config); !error.empty()) return {BenchParse::Kind::error, error};
  return {};
}

void print_bench_help(std::FILE* stream) {
  std::fprintf(stream,
               "usage: cuflash bench [flags]\n\n"
               "Times attention on the GPU: every combination of --pass, --head-dim, --mask and --seqlen\n"
               "on each --backend, with random normal inputs in [B, S, H, D] layout (B = tokens/seqlen,\n"
               "H = hidden/head-dim unless given). Per point: one checked call (outputs must be finite),\n"
               "a warm-up, then calls timed one by one with CUDA events (L2 overwritten before each);\n"
               "the median is reported. TFLOP/s: 4*B*H*S*S*D, halved when causal, x3.5 for fwdbwd.\n"
               "Also per point: the host wall time of its first call (first ms: a backend that builds\n"
               "per shape, like cudnn's graphs, builds then) and the median host time to launch one call\n"
               "(host us: the per-call overhead).\n"
               "Decode mode (--mode decode, --sweep decode): --q-len queries per sequence against a KV\n"
               "cache of --kv-len keys (paged with shuffled block tables, or contiguous for --page-size 0),\n"
               "no append; GB/s = bytes of K and V read (2*B*kv_len*Hk*D*2) / median; the timed calls\n"
               "skip the host check of the indices (check_index_contents off, as a decode loop would);\n"
               "a point whose tensors do not fit in free GPU memory is reported as skipped.\n"
               "A point that fails prints its Status and the sweep goes on. Exit code 0: every point\n"
               "ran; 1: some point failed, or no GPU; 2: a bad flag.\n\n"
               "flags:\n");
  print_flags(stream, flags(), 24);
}

}  // namespace cuflash::tool
