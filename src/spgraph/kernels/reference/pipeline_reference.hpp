// CPU reference of one layer of one chunk, stages 1-4 (gather, combine, attention), composed from
// the per-stage references; used by the executor tests and by serve_loop --verify.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/reference/sparse_mla_reference.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::kernels::reference {

/// @brief One layer's inputs for one chunk, as the device sees them at (r_bucket, t_bucket).
struct LayerStepInputs {
  const model::LayerConfig* layer{nullptr};
  CacheView swa{};                    ///< the layer's SWA cache (host copy) and the chunk's SWA block table
  CacheView compressed{};             ///< r > 1: the compressed cache and its block table
  HostChunk chunk{};                  ///< scalars of this layer's ratio; arrays of r_bucket requests
  int r_bucket{0};
  int t_bucket{0};
  std::int64_t max_rows_per_request{0};  ///< M_max of the layer
  const std::uint16_t* q{nullptr};    ///< [t_bucket, h_q, d_qk] bf16 bits (only `tokens` rows are read)
  const std::int32_t* topk{nullptr};  ///< [t_bucket, top_k], null when r = 1
  std::span<const float> attn_sink;   ///< [h_q] or empty
  std::span<const int> tokens;        ///< tokens to compute; empty: all t_bucket tokens
};

/// @brief What stages 1-3 produced, for tests that check the device stage by stage.
struct LayerStepIntermediates {
  std::vector<std::uint16_t> kv;        ///< [r_bucket * M_max, 512] bf16 bits (rows past r_bucket * M unwritten, 0)
  std::vector<std::int32_t> combined;   ///< [t_bucket, combined_width]
  std::vector<std::int32_t> lens;       ///< [t_bucket]
};

/// @brief Runs gather -> combine -> attention for the requested tokens; faults go to `log`.
/// @returns outputs for `tokens`, in order (all t_bucket tokens when `tokens` is empty).
SparseMlaReferenceOutputs layer_step_reference(const LayerStepInputs& in, FaultLog& log,
                                               LayerStepIntermediates* keep = nullptr);

/// @brief HostChunk for a chunk of `query_lens`/`seq_lens` at ratio r, padded to r_bucket as the
///        executor pads it (query_start_loc repeats the token count; padded lengths are 0).
HostChunk make_host_chunk(std::span<const int> query_lens, std::span<const int> seq_lens, int compress_ratio,
                          int window, int r_bucket);

}  // namespace spg::kernels::reference
