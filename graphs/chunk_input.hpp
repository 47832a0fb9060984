// What the host hands the executor for one chunk: lengths, block table rows and insert slots.
//
// Plain spans over the caller's memory; the executor copies what the step needs into its pinned
// staging block and keeps no reference. Formulas: docs/pipeline.md, "Per-chunk inputs".
#pragma once

#include <cstdint>
#include <span>

#include "memory/pipeline_pool.hpp"

namespace spg::graphs {

/// @brief One request of a chunk.
struct RequestInput {
  int query_len{0};  ///< tokens this chunk prefills for the request
  int seq_len{0};    ///< tokens so far, this chunk's included
  /// Physical SWA cache blocks of the request, in logical order: at least ceil(seq_len / swa_block_size).
  std::span<const std::int32_t> swa_blocks;
  /// Per compression ratio (index memory::ratio_index(r); index 0 unused): compressed cache blocks,
  /// at least ceil((seq_len / r) / (block_tokens / r)) (the blocks of its seq_len / r rows) for
  /// each ratio the layer program uses.
  std::span<const std::int32_t> compressed_blocks[memory::kNumRatios];
};

/// @brief One chunk: up to R requests, their tokens laid out request after request.
struct ChunkInput {
  std::span<const RequestInput> requests;
  /// Insert stage only: the SWA cache slot of each new token (one per token, -1 to skip). Empty
  /// (with every compressed_slots list empty too): the device derives every slot from the block
  /// tables, the SWA slot of position p as swa_blocks[p / swa_block_size] * swa_block_size +
  /// p % swa_block_size and a compressed row's likewise, which spares the host all per-token copies
  /// (docs/pipeline.md, "Per-chunk inputs").
  std::span<const std::int32_t> swa_slots;
  /// Insert stage only, per ratio: the slot of each compressed row the chunk completes, in request
  /// order; empty when swa_slots is (derived slots).
  std::span<const std::int32_t> compressed_slots[memory::kNumRatios];

  [[nodiscard]] int num_tokens() const noexcept {
    int t = 0;
    for (const RequestInput& r : requests) t += r.query_len;
    return t;
  }
};

}  // namespace spg::graphs
