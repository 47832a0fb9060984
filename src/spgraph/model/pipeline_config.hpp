// The configuration a pipeline is planned from: per-layer attention settings, cache geometry and
// the chunk limits. Everything the buffer pool's size depends on is here (docs/memory.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spgraph/model/cache_format.hpp"

namespace spg::model {

/// @brief One attention layer's settings (docs/pipeline.md, "Layer configuration").
struct LayerConfig {
  int h_q{128};             ///< 64 or 128 query heads, one KV head
  int d_qk{512};            ///< 512 (V4 cache form)
  int d_v{512};             ///< always 512
  int window{128};          ///< W, sliding-window length
  int compress_ratio{4};    ///< r: 1 (SWA only), 4 (C4A) or 128 (C128A)
  int top_k{1024};          ///< 0 when r = 1; 512/1024 when r = 4; up to 8192 when r = 128
  float sm_scale{0.0F};     ///< 0 means d_qk^-0.5
  bool attn_sink{true};     ///< whether the layer has a per-head sink

  [[nodiscard]] float scale() const noexcept;
  /// Width of the combined index rows: round_up(top_k + W, 128).
  [[nodiscard]] int combined_width() const noexcept { return (top_k + window + 127) / 128 * 128; }
  /// "C4A top_k 1024 h128" style label.
  [[nodiscard]] std::string label() const;
};

/// @brief Geometry of the paged FP8 caches (shared by all layers of a kind).
struct CacheConfig {
  int swa_block_size{64};      ///< tokens per SWA cache block
  int block_tokens{256};       ///< sequence positions per compressed cache block (block_tokens / r rows)
  int swa_blocks{2048};        ///< physical blocks in each layer's SWA cache
  int compressed_blocks{2048}; ///< physical blocks in each layer's compressed cache
};

/// Most block-table entries a chunk's metadata may hold (16 MiB of int32): the whole block is
/// copied to the device on every step.
inline constexpr std::int64_t kMaxChunkTableEntries = std::int64_t{1} << 22;

/// @brief Limits of one chunk and the model's layer program.
struct PipelineConfig {
  int max_requests{4};        ///< R: requests per chunk
  int max_tokens{2048};       ///< T: tokens per chunk (max_num_batched_tokens)
  int max_model_len{65536};   ///< longest sequence a request may reach
  std::vector<LayerConfig> layers;
  CacheConfig cache;

  /// @throws InvalidArgument naming the first field out of bounds, with its value and bounds.
  void validate() const;

  /// The program's sliding window W: validate() requires every layer to have the same one, since
  /// gather_lens (min(seq_len, query_len + W - 1)) are per-step data shared by every layer.
  [[nodiscard]] int window() const noexcept { return layers.empty() ? 0 : layers.front().window; }

  /// Entries of the per-step block tables (one row per request: the SWA table and one table per
  /// compressed ratio); validate() bounds them by kMaxChunkTableEntries.
  [[nodiscard]] std::int64_t chunk_table_entries() const noexcept;

  /// Blocks a request can span in the SWA cache / a compressed cache (block table widths).
  [[nodiscard]] int swa_blocks_per_request() const noexcept;
  [[nodiscard]] int compressed_blocks_per_request() const noexcept;
  /// M_max for one layer: max_model_len / r (0 when r = 1) + min(max_model_len, T + W - 1).
  [[nodiscard]] std::int64_t max_kv_rows(const LayerConfig& layer) const noexcept;

  /// DeepSeek-V4-style program of table B's "model" workload: 4 C4A (top_k 1024), 2 C128A, 2 SWA-only.
  static PipelineConfig v4_default();
  /// One layer program: a single layer of the given kind.
  static PipelineConfig single_layer(const LayerConfig& layer, int max_requests, int max_tokens, int max_model_len);
};

}  // namespace spg::model
