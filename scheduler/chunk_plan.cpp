// Chunk metadata helpers and bucket choice: see chunk_plan.hpp.
#include "scheduler/chunk_plan.hpp"

#include <algorithm>

#include "memory/error.hpp"

namespace spg::scheduler {

int ChunkPlan::n_rows(int ratio) const noexcept {
  if (ratio <= 1) {
    return 0;
  }
  int n = 0;
  for (const std::int32_t s : seq_lens) {
    n = std::max(n, static_cast<int>(s) / ratio);
  }
  return n;
}

int ChunkPlan::m_rows(int ratio) const noexcept {
  int g = 0;
  for (const std::int32_t s : gather_lens) {
    g = std::max(g, static_cast<int>(s));
  }
  return n_rows(ratio) + g;
}

const ChunkCachePlan& ChunkPlan::cache(int ratio) const {
  const auto it =
      std::find_if(caches.begin(), caches.end(), [ratio](const ChunkCachePlan& c) { return c.ratio == ratio; });
  SPG_EXPECTS(it != caches.end(), "ratio = " << ratio << " has no cache in this layer program");
  return *it;
}

}  // namespace spg::scheduler
