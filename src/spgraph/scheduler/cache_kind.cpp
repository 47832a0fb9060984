// Cache kinds of a layer program: see cache_kind.hpp.
#include "spgraph/scheduler/cache_kind.hpp"

#include <algorithm>

#include "spgraph/core/error.hpp"

namespace spg::scheduler {

std::vector<CacheKind> cache_kinds(const model::PipelineConfig& pipeline) {
  SPG_EXPECTS(!pipeline.layers.empty(), "pipeline.layers is empty: the layer program needs at least one layer");
  const model::CacheConfig& cache = pipeline.cache;
  SPG_EXPECTS(cache.swa_block_size >= 1, "cache.swa_block_size = " << cache.swa_block_size << " must be at least 1");
  SPG_EXPECTS(cache.swa_blocks >= 1, "cache.swa_blocks = " << cache.swa_blocks << " must be at least 1");

  std::vector<int> ratios;
  for (std::size_t i = 0; i < pipeline.layers.size(); ++i) {
    const int r = pipeline.layers[i].compress_ratio;
    SPG_EXPECTS(r >= 1, "layers[" << i << "].compress_ratio = " << r << " must be at least 1");
    if (r > 1 && std::find(ratios.begin(), ratios.end(), r) == ratios.end()) {
      ratios.push_back(r);
    }
  }
  std::sort(ratios.begin(), ratios.end());

  std::vector<CacheKind> kinds;
  kinds.push_back(CacheKind{1, cache.swa_block_size, cache.swa_block_size, cache.swa_blocks});
  if (!ratios.empty()) {
    SPG_EXPECTS(cache.compressed_blocks >= 1,
                "cache.compressed_blocks = " << cache.compressed_blocks << " must be at least 1");
  }
  for (const int r : ratios) {
    SPG_EXPECTS(cache.block_tokens >= r && cache.block_tokens % r == 0,
                "cache.block_tokens = " << cache.block_tokens << " must be a positive multiple of compress_ratio "
                                        << r << " (a compressed block holds block_tokens / r rows)");
    kinds.push_back(CacheKind{r, cache.block_tokens, cache.block_tokens / r, cache.compressed_blocks});
  }
  return kinds;
}

}  // namespace spg::scheduler
