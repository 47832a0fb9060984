// The paged caches a layer program needs, and how many blocks a sequence takes in each.
//
// Every layer has an SWA cache; every compression ratio r > 1 in the program adds a compressed
// cache. Layers of one kind share block ids (and so one block table per request), each with its
// own physical cache of the same geometry. Geometry: docs/pipeline.md, "FP8 paged KV cache".
#pragma once

#include <cstdint>
#include <vector>

#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::scheduler {

/// @brief One cache kind: the SWA cache (ratio 1) or the compressed cache of ratio r.
struct CacheKind {
  int ratio{1};            ///< 1 for the SWA cache, r for a compressed cache
  int block_positions{0};  ///< sequence positions one block covers (swa_block_size or block_tokens)
  int rows_per_block{0};   ///< cache rows per block: block_positions / ratio
  int num_blocks{0};       ///< physical blocks of each layer's cache of this kind

  [[nodiscard]] bool is_swa() const noexcept { return ratio == 1; }
  /// Cache rows a sequence of `seq_len` tokens has: seq_len for SWA, floor(seq_len / r) otherwise.
  [[nodiscard]] int rows(int seq_len) const noexcept { return seq_len / ratio; }
  /// Blocks that hold those rows: ceil(rows / rows_per_block).
  [[nodiscard]] int blocks_for(int seq_len) const noexcept {
    return (rows(seq_len) + rows_per_block - 1) / rows_per_block;
  }
  /// Slot of row `row` through a block table (graphs::slot_of).
  [[nodiscard]] std::int32_t slot(const std::vector<std::int32_t>& block_table, int row) const {
    return static_cast<std::int32_t>(graphs::slot_of(block_table, rows_per_block, row));
  }
};

/// @brief The kinds of a layer program: the SWA cache first, then one per distinct ratio r > 1, ascending.
/// @throws InvalidArgument naming the field when the program is empty, a ratio is not positive,
///         swa_block_size or the block counts are not positive, or block_tokens is not a positive
///         multiple of a ratio.
[[nodiscard]] std::vector<CacheKind> cache_kinds(const model::PipelineConfig& pipeline);

}  // namespace spg::scheduler
