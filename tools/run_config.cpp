#include "run_config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cuflash::tool {

const char* input_layout_name(InputLayout layout) {
  switch (layout) {
    case InputLayout::dense: return "dense";
    case InputLayout::varlen: return "varlen";
    case InputLayout::paged: return "paged";
  }
  return "?";
}

float RunConfig::resolved_scale() const {
  return scale ? *scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace {

using Setter = FlagSetter<RunConfig>;

std::string parse_float(std::string_view text, float* value) {
  float parsed = 0.0f;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  if (error != std::errc() || end != text.data() + text.size() || !std::isfinite(parsed))
    return "expected a finite number, got '" + std::string(text) + "'";
  *value = parsed;
  return {};
}

Setter int_pair_flag(int RunConfig::*first, int RunConfig::*second, int minimum) {
  return [first, second, minimum](RunConfig& config, std::string_view text) {
    int value = 0;
    std::string error = parse_int(text, minimum, &value);
    if (error.empty()) config.*first = config.*second = value;
    return error;
  };
}

const std::vector<Flag<RunConfig>>& flags() {
  static const std::vector<Flag<RunConfig>> table = {
      {"--batch", "N", "2", "sequences in the batch", int_flag(&RunConfig::batch, 1)},
      {"--seqlen", "N", "512", "sets --seqlen-q and --seqlen-k",
       int_pair_flag(&RunConfig::seqlen_q, &RunConfig::seqlen_k, 1)},
      {"--seqlen-q", "N", "512", "query length (varlen: the longest; equal to k lengths if --seqlen-k is the same)",
       int_flag(&RunConfig::seqlen_q, 1)},
      {"--seqlen-k", "N", "512", "key length, cached plus appended keys for paged (varlen: the longest)",
       int_flag(&RunConfig::seqlen_k, 1)},
      {"--heads", "N", "8", "sets --heads-q and --heads-kv",
       int_pair_flag(&RunConfig::heads_q, &RunConfig::heads_kv, 1)},
      {"--heads-q", "N", "8", "query heads", int_flag(&RunConfig::heads_q, 1)},
      {"--heads-kv", "N", "8", "key/value heads (GQA/MQA when fewer than --heads-q)",
       int_flag(&RunConfig::heads_kv, 1)},
      {"--head-dim", "N", "64", "head dimension", int_flag(&RunConfig::head_dim, 1)},
      {"--dtype", "f32|f16|bf16", "f32", "dtype of q, k, v, out and the gradients",
       choice_flag(&RunConfig::dtype, {{"f32", DType::f32}, {"f16", DType::f16}, {"bf16", DType::bf16}})},
      {"--layout", "dense|varlen|paged", "dense",
       "dense [B,S,H,D]; varlen: packed, random lengths; paged: KV cache in shuffled pages",
       choice_flag(&RunConfig::layout, {{"dense", InputLayout::dense},
                                                      {"varlen", InputLayout::varlen},
                                                      {"paged", InputLayout::paged}})},
      {"--page-size", "N", "16", "keys per page (paged only)", int_flag(&RunConfig::page_size, 1)},
      {"--append", "N", "0", "new keys per sequence written into the cache by the call (paged only)",
       int_flag(&RunConfig::append, 0)},
      {"--causal", nullptr, "off", "causal mask, aligned bottom-right", switch_flag(&RunConfig::causal, true)},
      {"--window-left", "N", "-1", "keys visible to the left of the diagonal; -1 unbounded",
       int_flag(&RunConfig::window_left, -1)},
      {"--window-right", "N", "-1", "keys visible to the right of the diagonal; -1 unbounded",
       int_flag(&RunConfig::window_right, -1)},
      {"--softcap", "X", "0", "score = X*tanh(score/X); 0 is off",
       [](RunConfig& config, std::string_view text) {
         std::string error = parse_float(text, &config.softcap);
         if (error.empty() && config.softcap < 0.0f) error = "must be >= 0, got " + std::string(text);
         return error;
       }},
      {"--alibi", nullptr, "off", "ALiBi bias with the standard slopes 2^(-8(h+1)/Hq)",
       switch_flag(&RunConfig::alibi, true)},
      {"--scale", "X", "1/sqrt(D)", "softmax scale",
       [](RunConfig& config, std::string_view text) {
         float value = 0.0f;
         std::string error = parse_float(text, &value);
         if (error.empty() && value <= 0.0f) error = "must be > 0, got " + std::string(text);
         if (error.empty()) config.scale = value;
         return error;
       }},
      {"--backward", nullptr, "off", "also run and check the backward (dq, dk, dv)",
       switch_flag(&RunConfig::backward, true)},
      {"--deterministic", nullptr, "off", "ask for a deterministic backward",
       switch_flag(&RunConfig::deterministic, true)},
      {"--backend", "auto|cpu|cuda|cudnn", "auto",
       "auto: a GPU when one is visible (the CPU if the GPU backends cannot run the problem), else the CPU",
       choice_flag(&RunConfig::backend, {{"auto", Backend::automatic},
                                                  {"cpu", Backend::cpu},
                                                  {"cuda", Backend::cuda},
                                                  {"cudnn", Backend::cudnn}})},
      {"--repeats", "N", "5", "timed calls after one warm-up; the median is reported",
       int_flag(&RunConfig::repeats, 1)},
      {"--seed", "N", "0", "seed of the random inputs",
       [](RunConfig& config, std::string_view text) {
         return parse_int<std::uint64_t>(text, 0, &config.seed);
       }},
      {"--no-check", nullptr, "off", "skip the float64 oracle (for problems too big for it)",
       switch_flag(&RunConfig::check, false)},
      {"--threads", "N", "0", "CPU backend threads (sets CUFLASH_NUM_THREADS); 0 keeps its default",
       int_flag(&RunConfig::threads, 0)},
      {"--help", nullptr, "", "print this help", nullptr},
  };
  return table;
}

// What the flags cannot say one at a time.
std::string check_combination(const RunConfig& config) {
  if (config.layout != InputLayout::paged && config.append > 0)
    return "--append: needs --layout paged";
  if (config.layout == InputLayout::paged && config.append > config.seqlen_k)
    return "--append: must be <= --seqlen-k (" + std::to_string(config.seqlen_k) + "), got " +
           std::to_string(config.append);
  // Index tensors are int32: varlen offsets count packed rows, block tables count pages.
  constexpr std::int64_t kMaxIndex = std::numeric_limits<std::int32_t>::max();
  const std::int64_t batch = config.batch;
  if (config.layout == InputLayout::varlen && batch * std::max(config.seqlen_q, config.seqlen_k) > kMaxIndex)
    return "--batch: varlen packs up to --batch x --seqlen rows, indexed by int32 cu_seqlens (at most " +
           std::to_string(kMaxIndex) + "), got " + std::to_string(batch) + " x " +
           std::to_string(std::max(config.seqlen_q, config.seqlen_k));
  const std::int64_t pages = batch * ((std::int64_t{config.seqlen_k} + config.page_size - 1) / config.page_size);
  if (config.layout == InputLayout::paged && pages > kMaxIndex)
    return "--batch: the paged cache has --batch x ceil(--seqlen-k / --page-size) = " + std::to_string(pages) +
           " pages, more than int32 block-table entries can number (" + std::to_string(kMaxIndex) + ")";
  return {};
}

}  // namespace

ParseResult parse_run_flags(const std::vector<std::string_view>& args, RunConfig* config) {
  ParseResult parsed = parse_flags(args, flags(), "run", config);
  if (parsed.kind != ParseResult::Kind::run) return parsed;
  if (std::string error = check_combination(*config); !error.empty()) return {ParseResult::Kind::error, error};
  return {};
}

void print_run_help(std::FILE* stream) {
  std::fprintf(stream,
               "usage: cuflash run [flags]\n\n"
               "Runs one attention problem with random normal inputs, times it (median of --repeats\n"
               "calls after a warm-up) and checks it against a float64 oracle. Exit code 0: passed;\n"
               "1: the call failed or the error is over the dtype's tolerance (f32 max-abs <= 1e-5,\n"
               "f16 rel-L2 <= 3e-3, bf16 rel-L2 <= 1e-2), or the problem cannot run here (more memory\n"
               "than the host or GPU has, said before anything is allocated; no GPU for --backend\n"
               "cuda/cudnn); 2: a bad flag. FLOPs: 4*Hq*D*sum(Lq*Lk), halved when causal; the backward\n"
               "counts 2.5x the forward.\n\n"
               "flags:\n");
  print_flags(stream, flags(), 30);
}

}  // namespace cuflash::tool
