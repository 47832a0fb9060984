// What a chunk's kernels read from device memory each step.
//
// Graph-readiness rests on this: every value that changes from step to step is read through a
// pointer into the pool's per-chunk metadata block, never passed by value (a kernel argument is
// frozen when the graph is captured). Bucket sizes and layer settings are static and may be
// passed by value. Layout of the metadata block: docs/memory.md.
#pragma once

#include <cstdint>

#include "spgraph/core/host_device.hpp"

namespace spg::kernels {

/// Largest requests_bucket the gather, insert and combine kernels take (one CTA scans every
/// request's metadata in shared memory).
inline constexpr int kMaxRequestsBucket = 128;

/// The cache slot of row `row` of a request whose block table maps row / rows_per_block to
/// physical block `block`: block * rows_per_block + row % rows_per_block (docs/pipeline.md). The
/// one implementation of table[p / bs] * bs + p % bs, for the kernels, the chunk encoder, the
/// scheduler and the bench.
SPG_HOST_DEVICE constexpr std::int64_t block_slot(std::int64_t block, int rows_per_block, int row) noexcept {
  return block * rows_per_block + row % rows_per_block;
}

/// @brief Per-step scalars of one chunk, for one compression ratio r (device memory).
struct ChunkScalars {
  std::int32_t num_requests;  ///< real requests, <= R_bucket
  std::int32_t num_tokens;    ///< real tokens, <= T_bucket (== query_start_loc[num_requests])
  std::int32_t n_rows;        ///< N = max_b(seq_len_b / r), 0 for r = 1
  std::int32_t m_rows;        ///< M: kv workspace rows per request, >= N + max_b(gather_len_b)
  std::int32_t new_rows;      ///< compressed rows this chunk completes (insert stage), 0 for r = 1
  std::int32_t derive_slots;  ///< r = 1 only: nonzero when the SWA insert derives each token's slot
                              ///< from the SWA block table instead of reading the slot list
  std::int32_t token_offset;  ///< a chunk of a step: its first row in the step's per-token buffers
                              ///< (q, top-k, K rows, out, lse, max_logits); 0 for a chunk run alone
  std::int32_t new_row_offset;  ///< a chunk of a step: its first row in the step's compressed K rows
                                ///< of this ratio (the rows earlier chunks complete); 0 alone
};
static_assert(sizeof(ChunkScalars) == 32);

/// @brief Device pointers to one chunk's per-request metadata (all int32, device memory).
struct ChunkArrays {
  const ChunkScalars* scalars;         ///< this layer's ratio's scalars
  const std::int32_t* query_start_loc; ///< [R_bucket + 1]; entries past num_requests repeat num_tokens
  const std::int32_t* seq_lens;        ///< [R_bucket]
  const std::int32_t* gather_lens;     ///< [R_bucket], min(seq_len, query_len + W - 1)
};

}  // namespace spg::kernels
