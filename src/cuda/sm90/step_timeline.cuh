// A debugging timeline of the TMA forward (not built by default): with
// CUFLASH_STEP_TIMELINE defined, thread 0 of each warpgroup of the first
// kTimelineCtas CTAs writes (event, clock64) pairs at the phases of its
// walk (producer: each load issued; consumer: item taken, tile's loads
// landed, GEMM turn, S done, softmax done, step end, drain, epilogue) into
// a device buffer, which the launch copies to $CUFLASH_TIMELINE_OUT after
// the $CUFLASH_TIMELINE_AT-th launch (bench/step_timeline.py reads it).
// Every CTA (up to kSpanCtas) also records its span: its SM, its start and
// end on the global timer (comparable across SMs) and on its clock, so that
// the spread of the CTAs' ends (a static walk ends with its slowest CTA)
// can be read beside the first CTAs' phases.
// Without the define the stamps compile to nothing.
#pragma once

#ifdef CUFLASH_STEP_TIMELINE
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace cuflash::detail::sm90 {

enum TimelineEvent : unsigned {
  kTlStart = 1,   // after the prologue's __syncthreads
  kTlItem,        // consumer: an item's Q landed and its slot read
  kTlLoads,       // consumer: a tile's K (and pending V) landed
  kTlTurn,        // consumer: its GEMM turn taken
  kTlS,           // consumer: S of the tile complete
  kTlSoftmax,     // consumer: the tile's softmax done
  kTlStep,        // consumer: the step's end (pending P V done, O rescaled)
  kTlDrainTurn,   // consumer: the drain's turn taken
  kTlDrain,       // consumer: the drain's P V complete
  kTlEpilogue,    // consumer: the epilogue's end
  kTlIdle,        // consumer: an item walked idle (no rows)
  kTlLoadQ,       // producer: Q's load issued (not where a warp of its own loads Q, kQWarp)
  kTlLoadK,       // producer: a K tile's load issued
  kTlLoadV,       // producer: a V tile's load issued
  kTlEnd,         // the warpgroup's walk is over
  kTlRows,        // consumer epilogue: the rows' sums, 1 / sum and lse computed
  kTlStaged,      // consumer epilogue: its O fragments written to shared memory
  kTlStagedAll,   // consumer epilogue: the warpgroup's writes fenced and synced
  kTlKWait,       // producer: about to wait for a stage's K slot (k_empty)
  kTlKFree,       // producer: that wait returned
  kTlKArmed,      // producer: K's expect-tx arrival done (its TMA issue next, then kTlLoadK)
};

constexpr int kTimelineCtas = 4, kTimelineWarpgroups = 4, kTimelineEntries = 8192, kSpanCtas = 1024;
// With CUFLASH_STEP_TIMELINE_PRODUCER_ONLY the consumers stamp only their
// start and end: their stamps slow the stamping CTAs' consumers ~1.2 x,
// which gives the producer a lead over them that the plain kernel's
// producer does not have (session 47), so the producer's waits for free
// slots (k_wait -> k_free) read true only without them.
#ifdef CUFLASH_STEP_TIMELINE_PRODUCER_ONLY
constexpr bool kTimelineConsumers = false;
#else
constexpr bool kTimelineConsumers = true;
#endif
// What a producer-only build stamps: the producer's events, and every
// warpgroup's start and end (the CTA's span takes its last warpgroup's end).
__host__ __device__ constexpr bool timeline_producer_only_keeps(unsigned event) {
  return event == kTlStart || event == kTlEnd || event == kTlLoadQ || event == kTlLoadK || event == kTlLoadV ||
         event == kTlKWait || event == kTlKFree || event == kTlKArmed;
}
// A CTA's span: the global timer (ns) and clock64 at its start (after the
// prologue) and at its last warpgroup's end, its SM, and its consumers'
// longest wait for a tile's data (timeline_waited: 0 where none reached
// kLongWait clocks).
struct CtaSpan {
  unsigned long long start_ns, end_ns, start_clock, end_clock, smid, longest_wait;
};
// Which wait timeline_waited records: a step's (its K, and the pending P V's
// V) or the drain's (the item's last V).
enum TimelineWait : unsigned { kTlWaitStep = 0, kTlWaitDrain = 1 };
constexpr unsigned long long kLongWait = 2000;  // clocks; shorter waits are not recorded
// One buffer per translation unit (internal linkage: each instantiation
// file's launches dump their own).
namespace {
__device__ unsigned long long g_step_timeline[kTimelineCtas][kTimelineWarpgroups][kTimelineEntries];
__device__ CtaSpan g_cta_spans[kSpanCtas];

// After the $CUFLASH_TIMELINE_AT-th launch (default 20) of this file's
// kernels: the buffer, behind a header of 8 ints (magic "TL02", D, consumers,
// stages, CTAs, items, kTimelineCtas x kTimelineWarpgroups, entries), then
// an int (the spans recorded: min(CTAs, kSpanCtas)) and those CtaSpans, into
// $CUFLASH_TIMELINE_OUT-d<D>-c<consumers>-s<stages>.bin.
void timeline_dump(cudaStream_t stream, int d, int consumers, int stages, int ctas, int items) {
  static int launches = 0;
  const char* out = std::getenv("CUFLASH_TIMELINE_OUT");
  const char* at = std::getenv("CUFLASH_TIMELINE_AT");
  if (out == nullptr || ++launches != (at != nullptr ? std::atoi(at) : 20)) return;
  static unsigned long long host[kTimelineCtas][kTimelineWarpgroups][kTimelineEntries];
  static CtaSpan spans[kSpanCtas];
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpyFromSymbol(host, g_step_timeline, sizeof(host)) != cudaSuccess ||
      cudaMemcpyFromSymbol(spans, g_cta_spans, sizeof(spans)) != cudaSuccess)
    return;
  const int recorded = ctas < kSpanCtas ? ctas : kSpanCtas;
  const std::string path = std::string(out) + "-d" + std::to_string(d) + "-c" + std::to_string(consumers) + "-s" +
                           std::to_string(stages) + ".bin";
  if (std::FILE* f = std::fopen(path.c_str(), "wb")) {
    const int header[8] = {0x544c3032, d, consumers, stages, ctas, items, kTimelineCtas * kTimelineWarpgroups,
                           kTimelineEntries};
    std::fwrite(header, sizeof(header), 1, f);
    std::fwrite(host, sizeof(host), 1, f);
    std::fwrite(&recorded, sizeof(recorded), 1, f);
    std::fwrite(spans, sizeof(CtaSpan), recorded, f);
    std::fclose(f);
  }
}
}  // namespace

__device__ __forceinline__ unsigned* timeline_counts() {
  __shared__ unsigned counts[kTimelineWarpgroups];
  return counts;
}
// [0]: the CTA's start clock; [1]: its consumers' longest wait for a
// tile's data, packed by timeline_waited.
__device__ __forceinline__ unsigned long long* timeline_wait_record() {
  __shared__ unsigned long long record[2];
  return record;
}
__device__ __forceinline__ unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Before the prologue's __syncthreads, which orders these writes before
// any warpgroup's end (timeline_stamp's atomicMax).
__device__ __forceinline__ void timeline_init() {
  if (threadIdx.x < kTimelineWarpgroups) timeline_counts()[threadIdx.x] = 0;
  if (threadIdx.x == 0) {
    const unsigned long long start = clock64();
    timeline_wait_record()[0] = start;
    timeline_wait_record()[1] = 0;
    if (blockIdx.x < kSpanCtas) {
      unsigned smid;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
      g_cta_spans[blockIdx.x] = CtaSpan{global_timer_ns(), 0, start, 0, smid, 0};
    }
  }
}
// Every thread of a consumer warpgroup calls it (a branch of its own
// between the wgmmas would serialize them, C7520); thread 0 of a
// warpgroup writes. The producer's leader calls it alone.
__device__ __forceinline__ void timeline_stamp(unsigned event) {
  if (!kTimelineConsumers && !timeline_producer_only_keeps(event)) return;
  const unsigned wg = threadIdx.x / 128;
  const unsigned long long now = clock64();
  if (threadIdx.x % 128 == 0 && blockIdx.x < kTimelineCtas && wg < kTimelineWarpgroups) {
    const unsigned n = timeline_counts()[wg];
    if (n < kTimelineEntries)
      g_step_timeline[blockIdx.x][wg][n] = (static_cast<unsigned long long>(event) << 56) | (now & ((1ull << 56) - 1));
    timeline_counts()[wg] = n + 1;
  }
  if (event == kTlEnd && threadIdx.x % 128 == 0 && blockIdx.x < kSpanCtas) {
    atomicMax(&g_cta_spans[blockIdx.x].end_ns, global_timer_ns());
    atomicMax(&g_cta_spans[blockIdx.x].end_clock, now);
    atomicMax(&g_cta_spans[blockIdx.x].longest_wait, timeline_wait_record()[1]);
  }
}
// A consumer's wait for a tile's data that began at clock `from` and has
// just ended, in every CTA (shared memory only: no global store on the
// walk, so unstamped CTAs keep the plain kernel's timing): the CTA keeps
// its longest of kLongWait clocks or more, packed as clocks (24 bits),
// start from the CTA's start (24), which (1) and the tile's kv_count (15).
__device__ __forceinline__ void timeline_waited(unsigned which, unsigned long long from, unsigned kv_count) {
  const unsigned long long waited = clock64() - from;
  if (threadIdx.x % 128 == 0 && waited >= kLongWait) {
    unsigned long long* record = timeline_wait_record();
    const auto field24 = [](unsigned long long x) { return x < (1ull << 24) ? x : (1ull << 24) - 1; };
    atomicMax(&record[1], field24(waited) << 40 | field24(from - record[0]) << 16 |
                              static_cast<unsigned long long>(which & 1) << 15 | (kv_count & 0x7fff));
  }
}

}  // namespace cuflash::detail::sm90

#define CUFLASH_TIMELINE_INIT() ::cuflash::detail::sm90::timeline_init()
#define CUFLASH_TIMELINE_DUMP(...) ::cuflash::detail::sm90::timeline_dump(__VA_ARGS__)
#define CUFLASH_TIMELINE(event) ::cuflash::detail::sm90::timeline_stamp(::cuflash::detail::sm90::event)
#define CUFLASH_TIMELINE_CLOCK() clock64()
#define CUFLASH_TIMELINE_WAITED(which, from, kv_count) \
  ::cuflash::detail::sm90::timeline_waited(::cuflash::detail::sm90::which, from, kv_count)
#else
#define CUFLASH_TIMELINE_INIT() ((void)0)
#define CUFLASH_TIMELINE_DUMP(...) ((void)0)
#define CUFLASH_TIMELINE(event) ((void)0)
#define CUFLASH_TIMELINE_CLOCK() 0ull
#define CUFLASH_TIMELINE_WAITED(which, from, kv_count) ((void)(from))
#endif
