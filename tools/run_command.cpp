#include "run_command.hpp"

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/float64_oracle.hpp"
#include "cuflash/cuflash.hpp"
#include "device_buffers.hpp"
#include "host_problem.hpp"
#include "memory_budget.hpp"
#include "report.hpp"

namespace cuflash::tool {
namespace {

// The oracle's answers, computed once even when the run moves to the CPU.
struct OracleResults {
  std::optional<oracle::ForwardResult> forward;
  std::optional<oracle::BackwardResult> backward;
};

struct Outcome {
  int exit_code = 0;
  bool gpu_unsupported = false;  // auto on the GPU got `unsupported`: rerun on the CPU
  std::string message;
};

bool is_output(std::size_t slot) { return slot == kOut || slot == kLse || slot == kDq || slot == kDk || slot == kDv; }

std::string backend_used(Placement placement, Backend backend) {
  if (backend != Backend::automatic) return backend_name(backend);
  return placement == Placement::host ? "cpu (auto; inputs in host memory)"
                                      : "auto on the GPU (the library picks cuda or cudnn)";
}

// A float64 check expected to take longer than this says so first.
constexpr double kAnnounceCheckSeconds = 2.0;

void announce_check(double seconds) {
  if (seconds < kAnnounceCheckSeconds) return;
  std::printf("  checking against float64 (about %s; --no-check to skip)\n", format_seconds(seconds).c_str());
  std::fflush(stdout);
}

const char* host_note() {
  if (cuda_device_count() > 0) return "a CUDA GPU is visible";
  return built_with_cuda() ? "no CUDA GPU visible" : "built without CUDA";
}

// One problem on one placement and backend: copies of the inputs there,
// outputs poisoned with NaN, each pass called once to check and then timed.
class Execution {
 public:
  Execution(const RunConfig& config, const HostProblem& problem, OracleResults* oracle, Placement placement,
            Backend backend)
      : config_(config), problem_(problem), oracle_(*oracle), placement_(placement),
        options_(attention_options(config, backend)) {
    for (std::size_t slot = 0; slot < kSlotCount; ++slot) {
      buffers_[slot] = Buffer(placement, problem.tensors[slot]);
      if (is_output(slot)) buffers_[slot].poison();
      else buffers_[slot].upload(problem.tensors[slot]);
      views_[slot] = buffers_[slot].view();
    }
    if (placement == Placement::host)
      std::printf("device:   host memory (%u hardware threads; %s)\n", std::thread::hardware_concurrency(), host_note());
    else
      std::printf("device:   %s\n", cuda_device_name(0).c_str());
    std::printf("backend:  %s\n", backend_used(placement, backend).c_str());
  }

  Outcome run() {
    Outcome outcome = forward();
    if (outcome.exit_code == 0 && !outcome.gpu_unsupported && config_.backward) outcome = backward();
    return outcome;
  }

 private:
  Outcome failed(const Status& status, const char* pass) const {
    if (status.code() == StatusCode::unsupported && placement_ == Placement::cuda &&
        options_.backend == Backend::automatic)
      return {0, true, status.message()};
    std::fflush(stdout);  // keeps the report and the error in order when both go to one log
    std::fprintf(stderr, "cuflash: %s failed: %s\n", pass, status.to_string().c_str());
    return {1, false, status.message()};
  }

  // Asks for the workspace, calls once and downloads `outputs` (written over
  // NaN) for checking, then times `repeats` more calls and prints the median.
  template <typename SizeFn, typename CallFn>
  std::optional<Outcome> time_pass(const char* pass, SizeFn workspace_size, CallFn call,
                                   const std::vector<std::pair<Slot, host::HostTensor*>>& outputs, double flops) {
    std::size_t bytes = 0;
    Status status = workspace_size(&bytes);
    if (!status.ok()) return failed(status, pass);
    const Buffer workspace = Buffer::raw(placement_, bytes);
    const RunContext context{nullptr, workspace.data(), bytes};

    status = call(context);
    if (!status.ok()) return failed(status, pass);
    synchronize(placement_);
    for (const auto& [slot, host] : outputs) buffers_[slot].download(host);

    CallTimer timer(placement_);
    std::vector<double> times_ms;
    for (int i = 0; i < config_.repeats; ++i) {
      timer.start();
      status = call(context);
      if (!status.ok()) return failed(status, pass);
      times_ms.push_back(timer.stop_ms());
    }
    report_timing((std::string(pass) + ":").c_str(), times_ms, flops,
                  placement_ == Placement::host ? "steady_clock" : "CUDA events");
    return std::nullopt;
  }

  Outcome forward() {
    const ForwardArgs args = forward_args(views_, problem_);
    host::HostTensor out = problem_.tensors[kOut], lse = problem_.tensors[kLse];
    host::HostTensor k_cache = problem_.tensors[kK], v_cache = problem_.tensors[kV];
    if (auto failure = time_pass(
            "forward", [&](std::size_t* bytes) { return forward_workspace_size(args, options_, bytes); },
            [&](const RunContext& context) { return attention_forward(args, options_, context); },
            {{kOut, &out}, {kLse, &lse}, {kK, &k_cache}, {kV, &v_cache}}, problem_.forward_flops))
      return *failure;

    bool passed = true;
    if (config_.append > 0) {
      passed = k_cache.bytes() == problem_.k_after.bytes() && v_cache.bytes() == problem_.v_after.bytes();
      std::printf("  append: %s\n", passed ? "the cache holds k_new/v_new at seqlens_k.. and is otherwise unchanged"
                                           : "the cache differs from the expected append -> FAIL");
    }
    if (!config_.check) {
      std::printf("  vs float64: skipped (--no-check)\n");
      return {passed ? 0 : 1, false, {}};
    }
    if (!oracle_.forward) {
      announce_check(oracle_seconds(problem_.forward_flops, false));
      oracle::ForwardResult result;
      const Status status = oracle::forward_float64(forward_args(host_views(problem_), problem_), options_, &result);
      if (!status.ok()) return failed(status, "float64 oracle forward");
      oracle_.forward = std::move(result);
    }
    passed = report_errors({{"out", compare(out, oracle_.forward->out)}, {"lse", compare(lse, oracle_.forward->lse)}},
                           tolerance_for(config_.dtype)) && passed;
    return {passed ? 0 : 1, false, {}};
  }

  Outcome backward() {
    // Attend over the appended cache as this tool built it, whatever the forward wrote.
    buffers_[kK].upload(problem_.k_after);
    buffers_[kV].upload(problem_.v_after);
    const BackwardArgs args = backward_args(views_, problem_);
    host::HostTensor dq = problem_.tensors[kDq], dk = problem_.tensors[kDk], dv = problem_.tensors[kDv];
    if (auto failure = time_pass(
            "backward", [&](std::size_t* bytes) { return backward_workspace_size(args, options_, bytes); },
            [&](const RunContext& context) { return attention_backward(args, options_, context); },
            {{kDq, &dq}, {kDk, &dk}, {kDv, &dv}}, 2.5 * problem_.forward_flops))
      return *failure;

    if (!config_.check) {
      std::printf("  vs float64: skipped (--no-check)\n");
      return {};
    }
    if (!oracle_.backward) {
      announce_check(oracle_seconds(problem_.forward_flops, true));
      Views host = host_views(problem_);
      host[kK] = problem_.k_after.view();
      host[kV] = problem_.v_after.view();
      oracle::BackwardResult result;
      const Status status = oracle::backward_float64(backward_args(host, problem_), options_, &result);
      if (!status.ok()) return failed(status, "float64 oracle backward");
      oracle_.backward = std::move(result);
    }
    const bool passed = report_errors({{"dq", compare(dq, oracle_.backward->dq)},
                                       {"dk", compare(dk, oracle_.backward->dk)},
                                       {"dv", compare(dv, oracle_.backward->dv)}},
                                      tolerance_for(config_.dtype));
    return {passed ? 0 : 1, false, {}};
  }

  const RunConfig& config_;
  const HostProblem& problem_;
  OracleResults& oracle_;
  Placement placement_;
  AttentionOptions options_;
  std::array<Buffer, kSlotCount> buffers_;
  Views views_;
};

void print_problem(const RunConfig& config, const HostProblem& problem) {
  std::printf("cuflash %s run\n", version());
  std::printf("problem:  B=%d Sq=%d Sk=%d Hq=%d Hk=%d D=%d %s, %s\n", config.batch, config.seqlen_q, config.seqlen_k,
              config.heads_q, config.heads_kv, config.head_dim, dtype_name(config.dtype),
              problem.describe_layout(config).c_str());
  std::printf("options:  scale=%g%s causal=%s window=(%d,%d) softcap=%g alibi=%s backward=%s deterministic=%s\n",
              config.resolved_scale(), config.scale ? "" : " (1/sqrt(D))", config.causal ? "on" : "off",
              config.window_left, config.window_right, config.softcap, config.alibi ? "on" : "off",
              config.backward ? "on" : "off", config.deterministic ? "on" : "off");
}

int refuse(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "cuflash run: %s\n", message.c_str());
  return 1;
}

// The refusal of a problem whose tensors, copies and checks cannot fit where
// it would run, else empty. `at_least`: the shapes are a lower bound.
std::string shapes_refusal(const RunConfig& config, const ProblemShapes& shapes, Placement placement, bool at_least) {
  const RunMemory need = run_memory(config, shapes, config.seqlen_q, config.seqlen_k, placement);
  const double available = host_bytes_available();
  const std::string subject = at_least ? "the problem needs at least" : "the problem needs";
  std::string what = placement == Placement::host ? "inputs, outputs and their copies" : "inputs, outputs";
  std::string hint;
  if (config.check) {
    what += ", float64 check";
    const double unchecked = need.host - need.host_check;
    if (unchecked <= available) hint = "--no-check needs " + format_bytes(unchecked);
  }
  std::string refusal = memory_refusal(subject, need.host, "host memory", what, available, "available", hint);
  if (refusal.empty() && placement == Placement::cuda)
    refusal = memory_refusal(subject, need.device, "GPU memory", "inputs, outputs, workspace", device_bytes_free(),
                             "free");
  return refusal;
}

ProblemShapes exact_shapes(const RunConfig& config) {
  if (config.layout != InputLayout::varlen) return problem_shapes(config, 0, 0);
  const SequenceLengths lengths = draw_lengths(config);
  return problem_shapes(config, lengths.total_q(), lengths.total_kv());
}

// Varlen lengths are drawn (two ints a sequence) only once the problem at its
// shortest (every other sequence one token long) fits; the other layouts'
// shapes do not depend on them.
std::string problem_refusal(const RunConfig& config, Placement placement) {
  if (config.layout == InputLayout::varlen) {
    const std::int64_t others = config.batch - 1;
    const ProblemShapes shortest = problem_shapes(config, config.seqlen_q + others, config.seqlen_k + others);
    if (std::string refusal = shapes_refusal(config, shortest, placement, true); !refusal.empty()) return refusal;
  }
  return shapes_refusal(config, exact_shapes(config), placement, false);
}

// Moving to the CPU backend after the GPU refused the problem: its host
// buffers and scratch on top of what the GPU run needed, which is held now.
std::string fallback_refusal(const RunConfig& config) {
  const ProblemShapes shapes = exact_shapes(config);
  const double more = run_memory(config, shapes, config.seqlen_q, config.seqlen_k, Placement::host).host -
                      run_memory(config, shapes, config.seqlen_q, config.seqlen_k, Placement::cuda).host;
  return memory_refusal("the CPU backend needs", more, "more host memory", "copies of the inputs and outputs, scratch",
                        host_bytes_available(), "available");
}

}  // namespace

int run_command(const RunConfig& config) {
  if (config.threads > 0) setenv("CUFLASH_NUM_THREADS", std::to_string(config.threads).c_str(), 1);
  if (config.backend == Backend::cuda || config.backend == Backend::cudnn)
    if (const std::string reason = no_cuda_device_reason(); !reason.empty())
      return refuse(std::string("no CUDA device for --backend ") + backend_name(config.backend) + " (" + reason + ")");
  const Placement placement =
      config.backend != Backend::cpu && cuda_device_count() > 0 ? Placement::cuda : Placement::host;
  if (const std::string refusal = problem_refusal(config, placement); !refusal.empty()) return refuse(refusal);

  const HostProblem problem = build_problem(config);
  print_problem(config, problem);
  OracleResults oracle;
  Outcome outcome = Execution(config, problem, &oracle, placement, config.backend).run();
  if (outcome.gpu_unsupported) {
    std::printf("note:     the GPU backends cannot run this problem (%s); running it on the CPU backend instead\n",
                outcome.message.c_str());
    if (const std::string refusal = fallback_refusal(config); !refusal.empty()) return refuse(refusal);
    outcome = Execution(config, problem, &oracle, Placement::host, Backend::cpu).run();
  }
  std::printf("result:   %s\n", outcome.exit_code == 0 ? "PASS" : "FAIL");
  return outcome.exit_code;
}

}  // namespace cuflash::tool
