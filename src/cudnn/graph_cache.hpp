// Built cuDNN graphs (operation graph + execution plan), one per graph key
// (sdpa_plan.hpp: every shape, stride, dtype and option that shapes the
// graph), built once and reused by every later call with that key. Thread-safe:
// a key is built once even when several threads ask for it at the same time,
// and a build that failed is remembered, so that asking again (as `auto` and
// the workspace query do) costs a lookup, not another attempt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuflash/status.hpp"

namespace cuflash::detail::cudnn {

using GraphKey = std::vector<std::int64_t>;

struct BuiltGraph {
  // A cudnn_frontend::graph::Graph; type-erased so that only the files that
  // build and run graphs include the (heavy) frontend headers.
  std::shared_ptr<void> graph;
  std::vector<std::int64_t> variant_uids;  // the tensors execute takes, in the frontend's sorted order
  std::int64_t workspace_bytes = 0;        // cuDNN's own workspace
  double build_ms = 0.0;                   // validate + operation graph + heuristics + plan build
};

using GraphBuilder = std::function<Status(BuiltGraph*)>;

class GraphCache {
 public:
  static GraphCache& instance();

  // The graph of `key`: the cached one, or `build`'s (called at most once per key).
  Status get(const GraphKey& key, const GraphBuilder& build, std::shared_ptr<const BuiltGraph>* graph);

  struct Counters {
    std::size_t graphs = 0, failed = 0;  // keys settled (built or refused), builds that failed
    std::size_t hits = 0;                // lookups answered from the cache
    double build_ms = 0.0;               // total build time
  };
  Counters counters() const;

 private:
  struct KeyHash {
    std::size_t operator()(const GraphKey& key) const;
  };
  struct Entry {
    std::mutex build_mutex;  // held while the one build of this key runs
    bool done = false;
    Status status;
    std::shared_ptr<const BuiltGraph> graph;
  };

  mutable std::mutex mutex_;  // the map and the counters
  std::unordered_map<GraphKey, std::shared_ptr<Entry>, KeyHash> entries_;
  Counters counters_;
};

}  // namespace cuflash::detail::cudnn
