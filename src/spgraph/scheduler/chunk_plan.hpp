// ChunkPlan: one chunk's metadata on the host, as the executor copies it into its staging block.
//
// Arrays are unpadded (num_requests entries, num_tokens slots); padding to the bucket, and the
// choice of bucket (graphs::BucketSet), are the executor's: query_start_loc repeats num_tokens
// past num_requests (src/spgraph/kernels/chunk.hpp); block-table entries past a request's blocks are never
// read. Formulas: docs/pipeline.md.
#pragma once

#include <cstdint>
#include <vector>

#include "spgraph/graphs/chunk_format.hpp"

namespace spg::scheduler {

/// @brief One cache kind's part of a chunk: block tables, and where the insert stage writes.
///
/// A "new row" is a cache row this chunk completes: for the SWA cache one per new token, for a
/// compressed cache of ratio r row i = (p + 1) / r - 1 for each new position p with (p + 1) % r == 0.
struct ChunkCachePlan {
  int ratio{1};  ///< 1: the SWA cache; r: the compressed cache of ratio r
  /// [num_requests][blocks]: request b's physical block ids, exactly the blocks its seq_len needs.
  std::vector<std::vector<std::int32_t>> block_tables;
  /// [new rows]: slot = block_table[i / rows_per_block] * rows_per_block + i % rows_per_block.
  std::vector<std::int32_t> slot_mapping;
  /// [new rows]: the request's row index i of each new row (the position for SWA).
  std::vector<std::int32_t> rows;
  /// [new rows]: index (0 .. num_tokens - 1) of the chunk token whose position completes the row.
  std::vector<std::int32_t> row_tokens;
  /// [num_requests + 1]: request b's new rows are entries row_start_loc[b] .. row_start_loc[b + 1] - 1.
  std::vector<std::int32_t> row_start_loc;

  [[nodiscard]] int num_new_rows() const noexcept { return static_cast<int>(slot_mapping.size()); }
};

/// @brief One chunk: up to R requests and T tokens, each request a contiguous run of new tokens.
struct ChunkPlan {
  int num_requests{0};
  int num_tokens{0};
  int window{0};  ///< W used for gather_lens (the layer program's window)
  std::vector<std::int64_t> request_ids;      ///< [num_requests]
  std::vector<std::int32_t> query_lens;       ///< [num_requests], each >= 1
  std::vector<std::int32_t> seq_lens;         ///< [num_requests]: prefix + query_len after this chunk
  std::vector<std::int32_t> gather_lens;      ///< [num_requests]: min(seq_len, query_len + W - 1)
  std::vector<std::int32_t> query_start_loc;  ///< [num_requests + 1], from 0 to num_tokens
  /// One per cache kind, in the scheduler's cache_kinds() order (the SWA cache first).
  std::vector<ChunkCachePlan> caches;

  /// N for ratio r: max_b(seq_len_b / r); 0 for r = 1.
  [[nodiscard]] int n_rows(int ratio) const noexcept;
  /// The least M for ratio r: n_rows(r) + max_b(gather_len_b).
  [[nodiscard]] int m_rows(int ratio) const noexcept;
  /// The part of the chunk for the cache of `ratio` (1 = SWA).
  /// @throws InvalidArgument when the layer program has no cache of that ratio.
  [[nodiscard]] const ChunkCachePlan& cache(int ratio) const;

  /// The chunk as the executor's input: spans into this plan (valid while it lives, until the
  /// next input() call). `slot_lists`: hand over the insert slot mappings; false leaves them
  /// empty, so the device derives the same slots from the block tables (the host copies less).
  [[nodiscard]] const graphs::ChunkInput& input(bool slot_lists = false) const;

 private:
  mutable std::vector<graphs::RequestInput> request_inputs_;
  mutable graphs::ChunkInput input_;
};

}  // namespace spg::scheduler
