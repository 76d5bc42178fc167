// Memory a `cuflash run` or `cuflash bench` problem needs, known before
// anything is allocated, against what this machine has: a problem that cannot
// fit is refused in one line instead of ending in std::bad_alloc or an
// out-of-memory kill. Sizes are doubles: a product of flags (each up to 2^31)
// overflows any integer type, not a double.
#pragma once

#include <string>

#include "device_buffers.hpp"
#include "host_problem.hpp"
#include "run_config.hpp"

namespace cuflash::tool {

// Host memory this process can still take: /proc/meminfo's MemAvailable, or
// less where a cgroup limit (v1 or v2; the process's group and every parent)
// leaves less. Infinity when none of them can be read.
double host_bytes_available();

// Free memory of CUDA device 0 (cudaMemGetInfo); infinity when built without
// CUDA or when the query fails (the allocation then says why).
double device_bytes_free();

// "1.23 GiB", "512 MiB", "17 B"; up to EiB.
std::string format_bytes(double bytes);
// "40 s", "12 min", "3.5 h", "9 days".
std::string format_seconds(double seconds);

// What `cuflash run` holds at its peak, by what it allocates (the problem's
// host tensors and their copies, the buffers of the placement it runs on,
// the outputs downloaded for checking, the CPU backend's scratch and the
// float64 oracle's results).
struct RunMemory {
  double host = 0.0;
  double host_check = 0.0;  // of host: what the float64 check adds (--no-check saves it)
  double device = 0.0;      // GPU buffers and an estimate of the workspace; 0 on the host
};
RunMemory run_memory(const RunConfig& config, const ProblemShapes& shapes, int max_q_len, int max_kv_len,
                     Placement placement);

// The one-line refusal when `needed` bytes of `memory` ("host memory", "GPU
// memory") exceed `available`, else empty. With subject "the problem needs":
// "the problem needs 1.2 TiB of host memory (inputs, outputs, float64 check);
// 20.1 GiB available"; a `hint` (may be empty) is appended as "; hint".
std::string memory_refusal(const std::string& subject, double needed, const char* memory, const std::string& what,
                           double available, const char* available_word, const std::string& hint = {});

// Seconds the float64 oracle takes (one thread, naive loops) for a problem of
// `forward_flops`: about 0.4-0.6 ns per forward FLOP for the forward and
// 0.7-1.3 for the backward on a 2-core x86 VM, slower per FLOP for long keys.
double oracle_seconds(double forward_flops, bool backward_pass);

}  // namespace cuflash::tool
