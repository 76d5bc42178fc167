// The `cuflash` command: `cuflash run [flags]`, `cuflash bench [flags]`, `cuflash version`, `cuflash --help`.
// Exit codes: 0 success, 1 a failed call, a result over tolerance or a problem that cannot
// run here (too big for memory, no GPU; bench: a failed point), 2 a bad command line.
#include <cstdio>
#include <exception>
#include <new>
#include <string_view>
#include <vector>

#include "bench_command.hpp"
#include "bench_config.hpp"
#include "cuflash/cuflash.hpp"
#include "device_buffers.hpp"
#include "run_command.hpp"
#include "run_config.hpp"

namespace {

constexpr int kExitUsage = 2;

void print_help() {
  std::printf(
      "cuflash %s: exact softmax attention (FlashAttention semantics) on CPU and GPU backends\n\n"
      "usage: cuflash <command> [flags]\n\n"
      "commands:\n"
      "  run [flags]   run, time and check one attention problem (a default one without flags)\n"
      "  bench [flags] time attention on the GPU over many shapes (--sweep prefill: the papers' sweep;\n"
      "                cuflash bench --help: its flags)\n"
      "  version       print the version and the backends usable here\n"
      "  --help        print this help (cuflash run --help: the flags of run)\n\n",
      cuflash::version());
  cuflash::tool::print_run_help(stdout);
}

void print_version() {
  using cuflash::Backend;
  std::printf("cuflash %s\n", cuflash::version());
  std::printf("built %s CUDA; CUDA GPUs visible: %d\n", cuflash::tool::built_with_cuda() ? "with" : "without",
              cuflash::tool::cuda_device_count());
  std::printf("backends usable here:");
  for (Backend backend : {Backend::cpu, Backend::cuda, Backend::cudnn})
    std::printf(" %s=%s", cuflash::backend_name(backend), cuflash::backend_available(backend) ? "yes" : "no");
  std::printf("\n");
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "cuflash: %s\n", message.c_str());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  try {
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
      print_help();
      return 0;
    }
    const std::vector<std::string_view> rest(args.begin() + 1, args.end());
    if (args[0] == "version" || args[0] == "--version") {
      if (!rest.empty()) return usage_error("version: unexpected argument '" + std::string(rest[0]) + "'");
      print_version();
      return 0;
    }
    if (args[0] == "run") {
      cuflash::tool::RunConfig config;
      const auto parsed = cuflash::tool::parse_run_flags(rest, &config);
      if (parsed.kind == cuflash::tool::ParseResult::Kind::error) return usage_error(parsed.error);
      if (parsed.kind == cuflash::tool::ParseResult::Kind::help) {
        cuflash::tool::print_run_help(stdout);
        return 0;
      }
      return cuflash::tool::run_command(config);
    }
    if (args[0] == "bench") {
      cuflash::tool::BenchConfig config;
      const auto parsed = cuflash::tool::parse_bench_flags(rest, &config);
      if (parsed.kind == cuflash::tool::BenchParse::Kind::error) return usage_error(parsed.error);
      if (parsed.kind == cuflash::tool::BenchParse::Kind::help) {
        cuflash::tool::print_bench_help(stdout);
        return 0;
      }
      return cuflash::tool::bench_command(config);
    }
    return usage_error("unknown command '" + std::string(args[0]) + "' (commands: run, bench, version, --help)");
  } catch (const std::bad_alloc&) {  // past the commands' estimates of what they need
    std::fflush(stdout);
    std::fprintf(stderr, "cuflash: error: out of host memory (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& error) {
    std::fflush(stdout);
    std::fprintf(stderr, "cuflash: error: %s\n", error.what());
    return 1;
  }
}
