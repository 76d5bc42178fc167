// backend=auto for GPU memory: which of cuda and cudnn is faster for a call's
// shape, from the prefill benchmark's measurements (docs/perf/prefill.json),
// turned into auto_table_data.inc by bench/make_auto_table.py. Both backends
// compute the same function, so the table only decides which one runs; the
// other is still tried when the preferred one cannot run the call.
#pragma once

#include <cstddef>

#include "cuflash/options.hpp"
#include "problem.hpp"

namespace cuflash::detail {

struct AutoTableEntry {
  Pass pass;     // forward: the `fwd` time; backward: `fwdbwd` minus `fwd`
  int head_dim;
  bool causal;
  int seqlen;    // queries = keys per sequence
  int tokens;    // batch * seqlen
  DType dtype;
  Backend backend;  // the faster of cuda and cudnn there
};

// The measured points (auto_table_data.inc).
const AutoTableEntry* auto_table(std::size_t* count);

// The backend to try first for a GPU call: that of the nearest measured point
// with the same pass (and dtype, when the table has it): head dim closest,
// causal alike (a window with right bound 0 counts as causal), then the
// closest per-sequence length and total query tokens on a log scale. cuda
// when nothing was measured for the pass.
Backend preferred_gpu_backend(const Problem& problem);

}  // namespace cuflash::detail
