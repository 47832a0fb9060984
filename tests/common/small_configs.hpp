// Small layer programs the CPU tests plan, check and encode against (no device needed).
#pragma once

#include "spgraph/model/pipeline_config.hpp"

namespace spg::test {

/// Two layers, a C4A (h_q 64, top_k 512, sink) and an SWA-only one (h_q `swa_heads`, no sink),
/// R = 4, T = 64, max_model_len 1536, odd cache block counts (103 SWA, 29 compressed).
inline model::PipelineConfig two_layer_config(int swa_heads = 64) {
  model::PipelineConfig c;
  c.max_requests = 4;
  c.max_tokens = 64;
  c.max_model_len = 1536;
  c.layers = {model::LayerConfig{64, 512, 512, 128, 4, 512, 0.0F, true},
              model::LayerConfig{swa_heads, 512, 512, 128, 1, 0, 0.0F, false}};
  c.cache.swa_blocks = 103;
  c.cache.compressed_blocks = 29;
  return c;
}

}  // namespace spg::test
