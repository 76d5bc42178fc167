#include "graph_cache.hpp"

#include <chrono>

namespace cuflash::detail::cudnn {

std::size_t GraphCache::KeyHash::operator()(const GraphKey& key) const {
  // FNV-1a over the fields' bytes.
  std::uint64_t hash = 1469598103934665603ull;
  for (const std::int64_t field : key) {
    auto bits = static_cast<std::uint64_t>(field);
    for (int byte = 0; byte < 8; ++byte, bits >>= 8) {
      hash ^= bits & 0xff;
      hash *= 1099511628211ull;
    }
  }
  return static_cast<std::size_t>(hash);
}

GraphCache& GraphCache::instance() {
  // Never destroyed: graphs hold cuDNN plans, which must not be freed after
  // the CUDA context is gone at process exit.
  static GraphCache* cache = new GraphCache();
  return *cache;
}

Status GraphCache::get(const GraphKey& key, const GraphBuilder& build, std::shared_ptr<const BuiltGraph>* graph) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<Entry>& slot = entries_[key];
    if (!slot) slot = std::make_shared<Entry>();
    entry = slot;
  }
  std::lock_guard<std::mutex> building(entry->build_mutex);
  if (entry->done) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.hits;
  } else {
    auto built = std::make_shared<BuiltGraph>();
    const auto start = std::chrono::steady_clock::now();
    entry->status = build(built.get());
    built->build_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (entry->status.ok()) entry->graph = std::move(built);
    // "cuDNN cannot run this" is an answer to keep; a CUDA or cuDNN error
    // (out of memory, say) may pass, so the next call tries again.
    entry->done = entry->status.ok() || entry->status.code() == StatusCode::unsupported;
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.graphs += entry->done ? 1 : 0;
    counters_.failed += entry->status.ok() ? 0 : 1;
    counters_.build_ms += entry->graph ? entry->graph->build_ms : 0.0;
  }
  *graph = entry->graph;
  return entry->status;
}

GraphCache::Counters GraphCache::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace cuflash::detail::cudnn
