// Stage 3 of a chunk: combine each token's top-k compressed-row indices and its sliding window
// into one row of indices into the gathered kv workspace, with the row's length.
//
// Formulas: docs/pipeline.md, "Stages of one chunk", stage 3. Per-step values are read from the
// chunk's device metadata; the grid is sized by tokens_bucket only, so one captured launch serves
// every step of its bucket. Faults in device data are counted in a StepStatus.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels {

/// @brief An int32 argument given either by value or as a device scalar read by the kernel at run
///        time (so one captured launch serves every value written there).
struct ScalarArg {
  const std::int32_t* device{nullptr};  ///< device memory, 4-byte aligned; when set, `value` is ignored
  std::int32_t value{0};
};

/// @brief Arguments of stage 3. For token t of request b at absolute position pos:
///        combined[t, j] = topk_indices[t, j] + M * b for j < topk_len (a -1 entry stays -1: adding
///        M * b to it would point at the last row of request b - 1), then the window's swa_len rows
///        M * b + N + (pos - swa_len + 1 - gather_start_b) + j, and lens[t] = topk_len + swa_len.
///
/// Entries at or past lens[t] are not written. Tokens at or past num_tokens (padding) get
/// lens = 0 and nothing else. A top-k entry other than -1 outside 0 .. seq_len_b/r - 1 is written
/// as -1 (Fault::topk_index). A request with query_len > seq_len, gather_len outside
/// [min(seq_len, query_len + W - 1), seq_len], seq_len/r > N or N + gather_len > M gets lens = 0
/// for its tokens (Fault::seq_len); bad chunk scalars (num_requests, num_tokens out of their
/// buckets, N > M, M * requests_bucket past int32, query_start_loc not ascending from 0 to
/// num_tokens) give lens = 0 for every token (Fault::scalars).
///
/// Standalone calls (the drop-in op of the Python package, vLLM's argument list) leave
/// `chunk.scalars` null: then num_requests = requests_bucket, N and M come from `n_rows` and
/// `m_rows` (by value, or read from device memory), query_start_loc is taken relative to its first
/// entry (query_start_loc[0] may be any offset, as a slice of a larger batch's gives) and
/// num_tokens = query_start_loc[requests_bucket] - query_start_loc[0], which must lie in
/// [0, tokens_bucket]; tokens past it get lens = 0.
struct CombineIndicesArgs {
  const std::int32_t* topk_indices{nullptr};  ///< [tokens_bucket, topk_row_stride], read for every token of
                                               ///< the bucket; nullptr when r = 1
  int top_k{0};                                ///< 0 when r = 1
  int compress_ratio{1};                       ///< r: 1, 4 or 128
  int window{128};                             ///< W
  ChunkArrays chunk{};
  int tokens_bucket{0};                        ///< static bound on num_tokens: the grid covers it
  int requests_bucket{0};                      ///< static bound on num_requests
  std::int32_t* combined{nullptr};             ///< [tokens_bucket, combined_width]
  int combined_width{0};                       ///< >= top_k + W, a multiple of 4
  std::int32_t* lens{nullptr};                 ///< [tokens_bucket]
  StepStatus* status{nullptr};                 ///< null: faults are handled but not counted
  /// Elements between two tokens' top-k rows; 0 means top_k (rows packed). At least top_k.
  int topk_row_stride{0};
  /// Device scalar or null (0): the chunk's first row in topk_indices (a chunk of a step). Then
  /// only the real tokens' rows are read, once num_tokens is known, and an offset below 0 or
  /// *token_offset + num_tokens past `topk_rows` gives lens = 0 for every token (Fault::scalars).
  const std::int32_t* token_offset{nullptr};
  std::int64_t topk_rows{0};  ///< with token_offset (r > 1): the rows topk_indices holds
  /// Standalone calls only (chunk.scalars null): N and M. Ignored otherwise.
  ScalarArg n_rows{};
  ScalarArg m_rows{};
};

struct CombineIndices {
  /// @throws InvalidArgument naming the first argument out of bounds (r not in {1, 4, 128}; top_k
  ///         not 0 for r = 1 or outside [1, 65536] for r > 1; W outside [1, 65536]; combined_width
  ///         below top_k + W or not a multiple of 4; topk_row_stride below top_k; buckets out of
  ///         range; null or misaligned pointers; in a standalone call, N or M given by value with
  ///         N < 0, N > M or M * requests_bucket past 2^31 - 1). tokens_bucket = 0 is a call with
  ///         no work (run() launches nothing): requests_bucket may then be 0 and the per-token and
  ///         per-request arrays null.
  static void can_implement(const CombineIndicesArgs& args);
  /// Launches the kernel (one warp per token of the bucket); needs no workspace, allocates and
  /// syncs nothing. Returns cudaGetLastError() after the launch.
  static cudaError_t run(const CombineIndicesArgs& args, cudaStream_t stream) noexcept;
};

}  // namespace spg::kernels
