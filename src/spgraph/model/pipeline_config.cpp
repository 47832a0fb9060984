// PipelineConfig validation and the default V4 layer program: see pipeline_config.hpp.
#include "spgraph/model/pipeline_config.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "spgraph/core/error.hpp"

namespace spg::model {

float LayerConfig::scale() const noexcept {
  return sm_scale > 0.0F ? sm_scale : 1.0F / std::sqrt(static_cast<float>(d_qk));
}

std::string LayerConfig::label() const {
  std::ostringstream os;
  if (compress_ratio == 1) {
    os << "SWA";
  } else {
    os << 'C' << compress_ratio << "A top_k " << top_k;
  }
  os << " h" << h_q;
  return os.str();
}

namespace {
void validate_layer(const LayerConfig& l, std::size_t i) {
  SPG_EXPECTS(l.h_q == 64 || l.h_q == 128, "layers[" << i << "].h_q = " << l.h_q << " must be 64 or 128");
  SPG_EXPECTS(l.d_qk == kHeadDim,
              "layers[" << i << "].d_qk = " << l.d_qk << " must be " << kHeadDim
                        << " (the FP8 cache holds 512-value rows; 576 is attention-only)");
  SPG_EXPECTS(l.d_v == kHeadDim, "layers[" << i << "].d_v = " << l.d_v << " must be " << kHeadDim);
  SPG_EXPECTS(l.window >= 1 && l.window <= 4096, "layers[" << i << "].window = " << l.window << " must be in [1, 4096]");
  const int r = l.compress_ratio;
  SPG_EXPECTS(r == 1 || r == 4 || r == 128, "layers[" << i << "].compress_ratio = " << r << " must be 1, 4 or 128");
  if (r == 1) {
    SPG_EXPECTS(l.top_k == 0, "layers[" << i << "].top_k = " << l.top_k << " must be 0 for an SWA-only layer (r = 1)");
  } else if (r == 4) {
    SPG_EXPECTS(l.top_k == 512 || l.top_k == 1024,
                "layers[" << i << "].top_k = " << l.top_k << " must be 512 or 1024 when compress_ratio = 4");
  } else {
    SPG_EXPECTS(l.top_k >= 64 && l.top_k <= 8192 && l.top_k % 64 == 0,
                "layers[" << i << "].top_k = " << l.top_k
                          << " must be a multiple of 64 in [64, 8192] when compress_ratio = 128");
  }
  SPG_EXPECTS(l.sm_scale >= 0.0F && std::isfinite(l.sm_scale),
              "layers[" << i << "].sm_scale = " << l.sm_scale << " must be finite and >= 0 (0 = d_qk^-0.5)");
}
}  // namespace

void PipelineConfig::validate() const {
  SPG_EXPECTS(max_requests >= 1 && max_requests <= 64, "max_requests = " << max_requests << " must be in [1, 64]");
  SPG_EXPECTS(max_tokens >= 1 && max_tokens <= 65536, "max_tokens = " << max_tokens << " must be in [1, 65536]");
  SPG_EXPECTS(max_model_len >= 1 && max_model_len <= (1 << 20),
              "max_model_len = " << max_model_len << " must be in [1, 1048576]");
  SPG_EXPECTS(!layers.empty(), "layers: the layer program must hold at least one layer");
  SPG_EXPECTS(layers.size() <= 256, "layers: " << layers.size() << " layers, at most 256");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    validate_layer(layers[i], i);
    // gather_lens (min(seq_len, query_len + W - 1)) are per-step data shared by every layer.
    SPG_EXPECTS(layers[i].window == layers[0].window,
                "layers[" << i << "].window = " << layers[i].window << " differs from layers[0].window = "
                          << layers[0].window << "; one layer program uses one window");
  }
  SPG_EXPECTS(cache.swa_block_size >= 1 && cache.swa_block_size <= 1024,
              "cache.swa_block_size = " << cache.swa_block_size << " must be in [1, 1024]");
  SPG_EXPECTS(cache.block_tokens >= 128 && cache.block_tokens % 128 == 0 && cache.block_tokens <= 8192,
              "cache.block_tokens = " << cache.block_tokens
                                      << " must be a multiple of 128 in [128, 8192] (whole compressed rows for r = 128)");
  SPG_EXPECTS(cache.swa_blocks >= 1, "cache.swa_blocks = " << cache.swa_blocks << " must be at least 1");
  SPG_EXPECTS(cache.compressed_blocks >= 1,
              "cache.compressed_blocks = " << cache.compressed_blocks << " must be at least 1");
  // The chunk metadata block (docs/memory.md, "chunk_meta") is copied to the device whole on every
  // step; its block tables are what can grow without bound.
  const std::int64_t entries = chunk_table_entries();
  SPG_EXPECTS(entries <= kMaxChunkTableEntries,
              "the chunk metadata's block tables, max_requests x (max_model_len / cache.swa_block_size + 2 x "
              "max_model_len / cache.block_tokens) = "
                  << max_requests << " x (" << swa_blocks_per_request() << " + 2 x " << compressed_blocks_per_request()
                  << ") = " << entries << " entries (" << entries * 4 << " B, copied to the device every step), must be "
                  << "at most " << kMaxChunkTableEntries << " (16 MiB); lower max_requests or max_model_len, or raise "
                  << "cache.swa_block_size");
}

std::int64_t PipelineConfig::chunk_table_entries() const noexcept {
  return std::int64_t{max_requests} * (std::int64_t{swa_blocks_per_request()} + 2 * std::int64_t{compressed_blocks_per_request()});
}

int PipelineConfig::swa_blocks_per_request() const noexcept {
  return (max_model_len + cache.swa_block_size - 1) / cache.swa_block_size;
}

int PipelineConfig::compressed_blocks_per_request() const noexcept {
  return (max_model_len + cache.block_tokens - 1) / cache.block_tokens;
}

std::int64_t PipelineConfig::max_kv_rows(const LayerConfig& layer) const noexcept {
  const std::int64_t compressed = layer.compress_ratio == 1 ? 0 : max_model_len / layer.compress_ratio;
  const std::int64_t window = std::min<std::int64_t>(max_model_len, std::int64_t{max_tokens} + layer.window - 1);
  return compressed + window;
}

PipelineConfig PipelineConfig::v4_default() {
  PipelineConfig c;
  c.max_requests = 4;
  c.max_tokens = 2048;
  c.max_model_len = 65536;
  const LayerConfig c4{128, 512, 512, 128, 4, 1024, 0.0F, true};
  const LayerConfig c128{128, 512, 512, 128, 128, 512, 0.0F, true};
  const LayerConfig swa{128, 512, 512, 128, 1, 0, 0.0F, true};
  c.layers = {c4, c128, c4, swa, c4, c128, c4, swa};
  // Enough blocks for max_requests prompts of max_model_len at once, plus as many again for
  // requests queued behind them.
  c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request();
  c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request();
  return c;
}

PipelineConfig PipelineConfig::single_layer(const LayerConfig& layer, int max_requests, int max_tokens,
                                            int max_model_len) {
  PipelineConfig c;
  c.max_requests = max_requests;
  c.max_tokens = max_tokens;
  c.max_model_len = max_model_len;
  c.layers = {layer};
  c.cache.swa_blocks = std::max(1, max_requests * c.swa_blocks_per_request());
  c.cache.compressed_blocks = std::max(1, max_requests * c.compressed_blocks_per_request());
  return c;
}

}  // namespace spg::model
