// Stages 0-2 of a chunk: quantize new K rows into a paged V4 FP8 cache (insert) and dequantize a
// request's cache rows into the bf16 kv workspace (gather).
//
// Layout, quantization and the gather formulas: docs/pipeline.md, "FP8 paged KV cache" and
// "Stages of one chunk". Every per-step value (row counts, seq lens, N, M) is read from device
// memory, and grids are sized from static bounds only, so one captured launch serves every step
// of its bucket. Faults in device data are counted in a StepStatus (src/spgraph/kernels/step_status.hpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "spgraph/kernels/chunk.hpp"
#include "spgraph/kernels/step_status.hpp"
#include "spgraph/model/cache_format.hpp"

namespace spg::kernels {

// The cache format (src/spgraph/model/cache_format.hpp) under the kernels' names: a token's data row
// (448 e4m3 NoPE values, then 64 bf16 RoPE values), its scale row (7 UE8M0 tile exponents and
// one zero pad byte), and the 512 values of a K row and of a gathered kv row.
inline constexpr int kKvRowBytes = model::kCacheRowBytes;
inline constexpr int kKvScaleBytes = model::kCacheScaleBytes;
inline constexpr int kKvDim = model::kHeadDim;
inline constexpr int kKvNopeDim = model::kCacheNopeDim;
inline constexpr int kKvRopeDim = model::kCacheRopeDim;
inline constexpr int kKvTile = model::kCacheTile;
inline constexpr int kKvTiles = model::kCacheTiles;

/// @brief Geometry of one paged V4 FP8 cache: `num_blocks` blocks of `block_size` rows, each
///        block holding its rows' 576-byte data, then their 8-byte scale rows, padded to
///        `block_stride` bytes (a multiple of 576, at least min_block_stride(block_size)).
struct CacheLayout {
  int block_size{0};            ///< rows per block (64 for SWA; block_tokens / r for compressed)
  int num_blocks{0};
  std::int64_t block_stride{0}; ///< bytes between blocks

  /// The smallest block stride: round_up(block_size * (576 + 8), 576).
  [[nodiscard]] static constexpr std::int64_t min_block_stride(int block_size) noexcept {
    const std::int64_t raw = std::int64_t{block_size} * (kKvRowBytes + kKvScaleBytes);
    return (raw + kKvRowBytes - 1) / kKvRowBytes * kKvRowBytes;
  }
  /// The layout at the smallest block stride.
  /// @throws InvalidArgument when block_size or num_blocks is not positive.
  static CacheLayout make(int block_size, int num_blocks);
  /// A layout with a caller's block stride (an engine's cache may pad its blocks further).
  /// @throws InvalidArgument when block_size or num_blocks is not positive, or block_stride is not
  ///         a multiple of 576 at least min_block_stride(block_size).
  static CacheLayout make(int block_size, int num_blocks, std::int64_t block_stride);
  [[nodiscard]] std::size_t bytes() const noexcept {
    return static_cast<std::size_t>(num_blocks) * static_cast<std::size_t>(block_stride);
  }
  /// Rows the cache holds (slots 0 .. capacity() - 1).
  [[nodiscard]] std::int64_t capacity() const noexcept { return std::int64_t{num_blocks} * block_size; }
  /// Byte offsets of slot `s`'s data row and scale row.
  [[nodiscard]] std::int64_t row_offset(std::int64_t s) const noexcept {
    return s / block_size * block_stride + s % block_size * kKvRowBytes;
  }
  [[nodiscard]] std::int64_t scale_offset(std::int64_t s) const noexcept {
    return s / block_size * block_stride + std::int64_t{block_size} * kKvRowBytes + s % block_size * kKvScaleBytes;
  }
};

/// @brief Stage 0: quantize `rows` [rows_bucket, 512] bf16 (row stride 512) into `cache` at
///        `slot_mapping[i]`, for i < *num_rows. Slot -1 is skipped; a slot outside the cache is
///        skipped and counted (Fault::slot); *num_rows outside [0, rows_bucket] writes nothing
///        (Fault::scalars). Scale rows are written whole (7 exponents, pad byte 0).
///
/// `rows` and `slot_mapping` must hold rows_bucket entries: the kernel loads them for every row
/// of the bucket alongside *num_rows (padding rows are read, never written anywhere). With
/// `row_offset` only the real rows of `rows` are read, after the count.
///
/// Derived slots (optional): when `derive` is set and `*derive` is nonzero, the slots come from
/// the block table instead of `slot_mapping`. With ratio r (1: the SWA cache, its rows are the
/// chunk's tokens; 4 or 128: a compressed cache, its rows the compressed rows the chunk completes),
/// request b (b < *num_requests, query_len_b from query_start_loc) owns the next
/// floor(seq_len_b / r) - floor((seq_len_b - query_len_b) / r) rows of the launch, in request
/// order, and its k-th row is cache row p = floor((seq_len_b - query_len_b) / r) + k at slot
/// block_table[b][p / block_size] * block_size + p % block_size. A request whose rows run past the
/// table's width is skipped and counted once (Fault::seq_len); a row whose block id lies outside
/// the cache is skipped and counted (Fault::block_id).
struct KvInsertArgs {
  const __nv_bfloat16* rows{nullptr};
  const std::int32_t* slot_mapping{nullptr};  ///< [rows_bucket]
  /// Device scalar: real rows this step. Null: every row of the bucket (a standalone call).
  const std::int32_t* num_rows{nullptr};
  int rows_bucket{0};                         ///< static bound: the grid covers this many rows
  std::uint8_t* cache{nullptr};
  CacheLayout layout{};
  StepStatus* status{nullptr};                ///< null: faults are handled but not counted
  // Derived slots: all null (and requests_bucket 0) when the op always reads slot_mapping.
  const std::int32_t* derive{nullptr};        ///< device scalar flag
  int compress_ratio{1};                      ///< r of the cache: 1, 4 or 128
  const std::int32_t* block_table{nullptr};   ///< [requests_bucket, block_table_stride]
  int block_table_stride{0};
  const std::int32_t* query_start_loc{nullptr};  ///< [requests_bucket + 1]
  const std::int32_t* seq_lens{nullptr};         ///< [requests_bucket]
  const std::int32_t* num_requests{nullptr};     ///< device scalar
  int requests_bucket{0};  /// Device scalar or null (0, and `rows` holds rows_bucket rows): the launch's first row in
  /// `rows`, which it reads at [*row_offset, *row_offset + *num_rows) only (a chunk of a step).
  const std::int32_t* row_offset{nullptr};
  /// With row_offset: the rows `rows` holds; an offset below 0 or rows past it write nothing
  /// (Fault::scalars).
  std::int64_t source_rows{0};
};

struct KvInsert {
  /// @throws InvalidArgument naming the first argument out of bounds (null or misaligned rows,
  ///         slot_mapping or cache, rows_bucket < 0, bad layout; with `derive`: a null block table, query_start_loc,
  ///         seq_lens or num_requests, block_table_stride < 1, requests_bucket outside
  ///         [1, kMaxRequestsBucket], compress_ratio not 1, 4 or 128). rows_bucket = 0 is a call
  ///         with no work (run() launches nothing): rows and slot_mapping may then be null.
  static void can_implement(const KvInsertArgs& args);
  /// Launches the kernel; needs no workspace, allocates and syncs nothing. Returns
  /// cudaGetLastError() after the launch.
  static cudaError_t run(const KvInsertArgs& args, cudaStream_t stream) noexcept;
};

/// Which rows of each request a gather writes (docs/pipeline.md, stages 1 and 2).
enum class GatherPart {
  compressed,  ///< stage 1: compressed rows 0 .. seq_len/r - 1 into kv[b * M + i]
  window,      ///< stage 2: SWA positions seq_len - gather_len .. seq_len - 1 into kv[b * M + N + j]
  both,        ///< stages 1 and 2 in one launch: `cache`/`layout`/`block_table` are the compressed
               ///< cache's and `window_*` the SWA cache's
};

/// @brief Stages 1 and 2: dequantize cache rows into `kv`, a [requests_bucket * M, 512] bf16
///        workspace (row stride 512; M = chunk.scalars->m_rows, read on the device).
///
/// Requests at or past num_requests write nothing; rows of a request past its own count are not
/// written; seq_lens and gather_lens are read for all requests_bucket entries. A row whose block
/// id is outside the cache is written as zeros (Fault::block_id); a request whose rows do not fit
/// its block table, N or M is skipped (Fault::seq_len); scalars out of their bounds
/// (num_requests > requests_bucket, N > M, M > max_rows_per_request) skip the launch
/// (Fault::scalars). For the large workload prefer GatherPart::both: one launch instead of two.
///
/// Standalone calls (the drop-in op of the Python package) leave `chunk.scalars` null: then
/// num_requests = requests_bucket, M = max_rows_per_request and N = `window_offset`.
struct KvGatherArgs {
  const std::uint8_t* cache{nullptr};       ///< the part's cache (compressed cache for `both`)
  CacheLayout layout{};
  const std::int32_t* block_table{nullptr}; ///< [requests_bucket, block_table_stride] physical block ids
  int block_table_stride{0};
  ChunkArrays chunk{};
  GatherPart part{GatherPart::compressed};
  int compress_ratio{1};                    ///< r: 1, 4 or 128
  int requests_bucket{0};                   ///< static bound on num_requests
  std::int64_t max_rows_per_request{0};     ///< static bound M_max on M: kv holds requests_bucket * M_max rows
  __nv_bfloat16* kv{nullptr};
  StepStatus* status{nullptr};              ///< null: faults are handled but not counted
  /// Standalone calls only (chunk.scalars null): N, the first kv row of each request's window part.
  int window_offset{0};
  // GatherPart::both only: the SWA cache read by stage 2 in the same launch.
  const std::uint8_t* window_cache{nullptr};
  CacheLayout window_layout{};
  const std::int32_t* window_block_table{nullptr};
  int window_block_table_stride{0};
  /// Programmatic dependent launch: the kernel may start while the stream's previous kernel
  /// finishes, resolving its rows (chunk metadata, block tables) meanwhile, and waits for that
  /// kernel to complete before it reads a cache row or writes `kv`. Set it only when the previous
  /// kernel writes neither the metadata nor the block tables (in the pipeline: any kernel but the
  /// stage-in).
  bool overlap_prologue{false};
};

struct KvGather {
  /// @throws InvalidArgument naming the first argument out of bounds (r not in {1, 4, 128}, a
  ///         compressed part with r = 1, null or misaligned pointers, requests_bucket outside
  ///         [0, kMaxRequestsBucket], max_rows_per_request outside [1, 2^31 / requests_bucket),
  ///         a block table stride < 1, a bad layout; in a standalone call, window_offset outside
  ///         [0, max_rows_per_request]). requests_bucket = 0 is a call with no work (run()
  ///         launches nothing): the block tables, lengths and kv may then be null, the strides
  ///         and max_rows_per_request 0; the caches and layouts are still checked.
  static void can_implement(const KvGatherArgs& args);
  /// Launches the kernel (a persistent grid sized from the SM count and the static bounds);
  /// needs no workspace, allocates and syncs nothing. Returns cudaGetLastError() after the launch.
  static cudaError_t run(const KvGatherArgs& args, cudaStream_t stream) noexcept;
};

}  // namespace spg::kernels
