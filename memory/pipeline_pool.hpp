// The pipeline's pool plan: every slot a layer program needs, sized from a PipelineConfig.
//
// Slot formulas are written out in docs/memory.md; this file is their one implementation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "memory/pipeline_config.hpp"
#include "memory/pool_plan.hpp"

namespace spg::memory {

/// Bytes of one paged-cache block of `rows` rows: the rows' 576-byte data, then their 8-byte
/// scale rows, padded up to a multiple of 576 (docs/pipeline.md, "FP8 paged KV cache").
[[nodiscard]] constexpr std::int64_t cache_block_stride(int rows) noexcept {
  const std::int64_t raw = std::int64_t{rows} * (kCacheRowBytes + kCacheScaleBytes);
  return (raw + kCacheRowBytes - 1) / kCacheRowBytes * kCacheRowBytes;
}

/// Index of a compression ratio among the per-ratio metadata: r = 1 -> 0, 4 -> 1, 128 -> 2.
[[nodiscard]] constexpr int ratio_index(int r) noexcept { return r == 1 ? 0 : (r == 4 ? 1 : 2); }
inline constexpr int kNumRatios = 3;
inline constexpr int kRatios[kNumRatios] = {1, 4, 128};
/// int32 words of one ratio's per-step scalars (spg::kernels::ChunkScalars is that size).
inline constexpr int kScalarWords = 8;

/// @brief Where each per-step array sits inside the chunk metadata block (int32 words).
///
/// The host writes the block into pinned staging; the graph's first node copies it to the device
/// block. Every offset is a multiple of 4 words (16 bytes).
struct ChunkMetaLayout {
  int scalars{0};                   ///< kNumRatios x ChunkScalars (kScalarWords words each)
  int query_start_loc{0};           ///< [R + 1]
  int seq_lens{0};                  ///< [R]
  int gather_lens{0};               ///< [R]
  int swa_block_table{0};           ///< [R, swa_table_width]
  int compressed_block_table[kNumRatios]{};  ///< per ratio (r = 4, 128): [R, compressed_table_width]; r = 1 unused
  int swa_slots{0};                 ///< [T]: slot of each new token in the SWA cache
  int compressed_slots[kNumRatios]{};  ///< per ratio: [compressed_slot_capacity(r)]
  int swa_table_width{0};
  int compressed_table_width{0};
  int words{0};                     ///< total size in int32 words

  [[nodiscard]] static ChunkMetaLayout make(const PipelineConfig& config);
  /// New compressed rows a chunk can produce for ratio r: T / r + R (each request may complete
  /// one row more than its share of tokens).
  [[nodiscard]] static int compressed_slot_capacity(const PipelineConfig& config, int r) noexcept;
  [[nodiscard]] std::size_t bytes() const noexcept { return static_cast<std::size_t>(words) * 4; }
};

/// Slot names of the pipeline pool (docs/memory.md lists them with their formulas).
namespace slots {
inline constexpr const char* kChunkMeta = "chunk_meta";
inline constexpr const char* kStepStatus = "step_status";
inline constexpr const char* kKvWorkspace = "kv_workspace";
inline constexpr const char* kCombined = "combined_indices";
inline constexpr const char* kTopkLens = "topk_lens";
inline constexpr const char* kStaging[2] = {"staging0", "staging1"};
/// Per-layer slots: layer_slot(3, "q") == "layer3.q".
[[nodiscard]] std::string layer_slot(std::size_t layer, const char* what);
}  // namespace slots

/// Bytes reserved for the per-step fault counters (the kernels' StepStatus must fit).
inline constexpr std::size_t kStepStatusBytes = 256;

/// @brief The widest combined-index row over the program: round_up(top_k + W, 128).
[[nodiscard]] int max_combined_width(const PipelineConfig& config) noexcept;
/// @brief M_max over the program: the kv workspace's rows per request.
[[nodiscard]] std::int64_t max_kv_rows(const PipelineConfig& config) noexcept;

/// Plans every slot of the pipeline for `config` (validated first).
/// @throws InvalidArgument from PipelineConfig::validate().
[[nodiscard]] PoolPlan plan_pipeline_pool(const PipelineConfig& config);

}  // namespace spg::memory
