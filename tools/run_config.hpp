// What `cuflash run` was asked to do: every dimension and option of the
// problem, and how to run and check it. Filled from the command line by
// parse_run_flags().
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuflash/options.hpp"
#include "cuflash/tensor.hpp"
#include "flag_table.hpp"

namespace cuflash::tool {

enum class InputLayout { dense, varlen, paged };

const char* input_layout_name(InputLayout layout);

struct RunConfig {
  int batch = 2;
  int seqlen_q = 512;
  int seqlen_k = 512;
  int heads_q = 8;
  int heads_kv = 8;
  int head_dim = 64;
  DType dtype = DType::f32;
  InputLayout layout = InputLayout::dense;
  int page_size = 16;
  int append = 0;  // paged: new tokens per sequence written into the cache

  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.0f;
  bool alibi = false;
  std::optional<float> scale;  // default 1/sqrt(head_dim)
  bool backward = false;
  bool deterministic = false;
  Backend backend = Backend::automatic;

  int repeats = 5;
  std::uint64_t seed = 0;
  bool check = true;
  int threads = 0;  // 0: the CPU backend's own default

  float resolved_scale() const;
};

using ParseResult = FlagParse;

// Flags are applied in order, so a later --seqlen overrides an earlier --seqlen-q.
ParseResult parse_run_flags(const std::vector<std::string_view>& args, RunConfig* config);

// Every flag of `cuflash run` with its default.
void print_run_help(std::FILE* stream);

}  // namespace cuflash::tool
