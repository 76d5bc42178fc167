#include "memory_budget.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#ifdef CUFLASH_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace cuflash::tool {
namespace {

constexpr double kUnlimited = std::numeric_limits<double>::infinity();

// The first number in a file ("max": unlimited); nullopt when it cannot be read.
std::optional<double> read_number(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string word;
  if (!(file >> word)) return std::nullopt;
  if (word == "max") return kUnlimited;
  char* end = nullptr;
  const double value = std::strtod(word.c_str(), &end);
  if (end == word.c_str()) return std::nullopt;
  return value;
}

// `key value` from a memory.stat file; 0 when absent.
double read_stat(const std::filesystem::path& path, const std::string& key) {
  std::ifstream file(path);
  std::string name;
  double value = 0.0;
  while (file >> name >> value)
    if (name == key) return value;
  return 0.0;
}

// Room left under the memory limits of the group at `path` under `root` and
// of its parents (a group that cannot be read, e.g. outside this cgroup
// namespace, is skipped). Reclaimable page cache (inactive files) counts as room.
double cgroup_room(const std::filesystem::path& root, const std::string& path, const char* limit_file,
                   const char* usage_file, const char* inactive_key) {
  double room = kUnlimited;
  std::filesystem::path group = root / std::filesystem::path(path).relative_path();
  for (;;) {
    const std::optional<double> limit = read_number(group / limit_file);
    const std::optional<double> usage = read_number(group / usage_file);
    // v1 says "no limit" with a number near 2^63.
    if (limit && usage && *limit < 0x1p60) {
      const double used = std::max(0.0, *usage - read_stat(group / "memory.stat", inactive_key));
      room = std::min(room, std::max(0.0, *limit - used));
    }
    if (group == root || !group.has_relative_path() || group.parent_path() == group) break;
    group = group.parent_path();
  }
  return room;
}

double cgroups_room() {
  std::ifstream file("/proc/self/cgroup");
  std::string line;
  double room = kUnlimited;
  while (std::getline(file, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::path".
    const std::size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (line.compare(0, first, "0") == 0 && controllers.empty()) {
      room = std::min(room, cgroup_room("/sys/fs/cgroup", path, "memory.max", "memory.current", "inactive_file"));
    } else {
      std::stringstream list(controllers);
      std::string controller;
      while (std::getline(list, controller, ','))
        if (controller == "memory")
          room = std::min(room, cgroup_room("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes",
                                            "memory.usage_in_bytes", "total_inactive_file"));
    }
  }
  return room;
}

double mem_available() {
  std::ifstream file("/proc/meminfo");
  std::string name, unit;
  double value = 0.0;
  while (file >> name >> value >> unit)
    if (name == "MemAvailable:") return value * 1024.0;
  return kUnlimited;
}

// Threads the CPU backend runs with (its parallel_for.hpp's rule): --threads,
// CUFLASH_NUM_THREADS, else the cores.
double cpu_threads(const RunConfig& config) {
  if (config.threads > 0) return config.threads;
  if (const char* text = std::getenv("CUFLASH_NUM_THREADS")) {
    char* end = nullptr;
    const long requested = std::strtol(text, &end, 10);
    if (end != text && *end == '\0' && requested > 0) return static_cast<double>(std::min(requested, 1024L));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

double host_bytes_available() { return std::min(mem_available(), cgroups_room()); }

double device_bytes_free() {
#ifdef CUFLASH_WITH_CUDA
  std::size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    (void)cudaGetLastError();
    return kUnlimited;
  }
  return static_cast<double>(free_bytes);
#else
  return kUnlimited;
#endif
}

std::string format_bytes(double bytes) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int unit = 0;
  while (unit < 6 && bytes >= 1024.0) {
    bytes /= 1024.0;
    ++unit;
  }
  char text[48];
  if (bytes >= 1e4) {  // past EiB
    std::snprintf(text, sizeof text, "%.3g %s", bytes, units[unit]);
  } else {
    const int decimals = bytes >= 100 || unit == 0 ? 0 : bytes >= 10 ? 1 : 2;
    std::snprintf(text, sizeof text, "%.*f %s", decimals, bytes, units[unit]);
  }
  return text;
}

std::string format_seconds(double seconds) {
  char text[48];
  if (seconds < 90) std::snprintf(text, sizeof text, "%.0f s", seconds);
  else if (seconds < 90 * 60) std::snprintf(text, sizeof text, "%.0f min", seconds / 60);
  else if (seconds < 48 * 3600) std::snprintf(text, sizeof text, "%.1f h", seconds / 3600);
  else std::snprintf(text, sizeof text, "%.3g days", seconds / 86400);
  return text;
}

RunMemory run_memory(const RunConfig& config, const ProblemShapes& shapes, int max_q_len, int max_kv_len,
                     Placement placement) {
  double tensors = 0.0, indices = 0.0;
  for (const TensorShape& shape : shapes) (shape.dtype == DType::i32 ? indices : tensors) += shape.bytes();
  const double q_elements = shapes[kQ].elements(), k_elements = shapes[kK].elements();
  const double lse_elements = shapes[kLse].elements();
  const double head_dim = config.head_dim, q_rows = max_q_len, kv_rows = max_kv_len;
  const bool on_host = placement == Placement::host;

  // build_problem: every slot, the cache again after the append (k_after,
  // v_after), the per-sequence lengths, and the index tensors' staging
  // vectors. Execution: a copy of every slot where the call runs.
  const double persistent = tensors + indices + shapes[kK].bytes() + shapes[kV].bytes() + 8.0 * config.batch +
                            indices + (on_host ? tensors + indices : 0.0);

  // The CPU backend's per-worker scratch (src/cpu forward.cpp/backward.cpp):
  // f32 rows of the longest sequence's keys, padded to 64-key tiles and a
  // multiple of 8 columns; the backward also sums dk/dv over a sequence's
  // keys, or over the whole cache for a KV cache.
  const double keys = std::ceil(kv_rows / 64.0) * 64.0, dim = std::ceil(head_dim / 8.0) * 8.0;
  const double threads = cpu_threads(config);
  const double cpu_forward = on_host ? threads * 2.0 * keys * dim * 4.0 : 0.0;
  const bool paged = config.layout == InputLayout::paged;
  const double gradient_rows = paged ? k_elements / (config.heads_kv * head_dim) : keys;
  // Backward items: one per (sequence, kv head); for a KV cache one per kv head.
  const double backward_workers = std::min(threads, static_cast<double>(config.heads_kv) * (paged ? 1 : config.batch));
  const double cpu_backward =
      on_host ? backward_workers * ((3.0 * keys + 2.0 * gradient_rows) * dim * 4.0 + 8.0 * keys) : 0.0;

  // The float64 oracle: its results in double, and per (sequence, head) the
  // rows as vectors of doubles (a heap block and a vector each) and a few
  // doubles per key.
  const double row = 8.0 * head_dim + 40.0;
  const double oracle_forward = 8.0 * (q_elements + lse_elements);
  const double oracle_forward_scratch = (q_rows + 2.0 * kv_rows) * row + 25.0 * kv_rows;
  const double oracle_backward = 8.0 * (q_elements + 2.0 * k_elements);
  const double oracle_backward_scratch = (2.0 * q_rows + 4.0 * kv_rows) * row + 25.0 * kv_rows;

  const auto peak = [&](bool check) {
    // forward(): out, lse and the cache downloaded, then the backend's call or the oracle.
    const double forward_outputs =
        shapes[kOut].bytes() + shapes[kLse].bytes() + shapes[kK].bytes() + shapes[kV].bytes();
    const double forward =
        forward_outputs + std::max(cpu_forward, check ? oracle_forward + oracle_forward_scratch : 0.0);
    if (!config.backward) return persistent + forward;
    // backward(): the forward's oracle results stay; dq, dk, dv downloaded.
    const double backward = (check ? oracle_forward : 0.0) + shapes[kDq].bytes() + shapes[kDk].bytes() +
                            shapes[kDv].bytes() +
                            std::max(cpu_backward, check ? oracle_backward + oracle_backward_scratch : 0.0);
    return persistent + std::max(forward, backward);
  };

  RunMemory memory;
  memory.host = peak(config.check);
  memory.host_check = memory.host - peak(false);
  // The GPU buffers, and the backward's workspace (an fp32 dq accumulator and
  // a float per row); the forward's split-KV partials are small.
  if (!on_host) memory.device = tensors + indices + (config.backward ? 4.0 * (q_elements + lse_elements) : 0.0);
  return memory;
}

std::string memory_refusal(const std::string& subject, double needed, const char* memory, const std::string& what,
                           double available, const char* available_word, const std::string& hint) {
  if (needed <= available) return {};
  return subject + " " + format_bytes(needed) + " of " + memory + " (" + what + "); " +
         format_bytes(available) + " " + available_word + (hint.empty() ? "" : "; " + hint);
}

double oracle_seconds(double forward_flops, bool backward_pass) {
  return forward_flops * (backward_pass ? 1.0e-9 : 0.6e-9);
}

}  // namespace cuflash::tool
