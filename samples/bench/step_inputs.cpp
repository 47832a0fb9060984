// The step benchmarks' configs and steps: see step_inputs.hpp.
#include "samples/bench/step_inputs.hpp"

#include "spgraph/core/error.hpp"

namespace spg::bench {

model::PipelineConfig step_config(bool model) {
  const int len = (kStepPrefix + kStepQuery + 255) / 256 * 256;
  model::PipelineConfig c;
  if (model) {
    c = model::PipelineConfig::v4_default();
    c.max_requests = kStepR;
    c.max_tokens = kStepT;
    c.max_model_len = len;
  } else {
    c = model::PipelineConfig::single_layer(model::LayerConfig{128, 512, 512, 128, 4, 1024, 0.0F, true}, kStepR, kStepT,
                                            len);
  }
  c.cache.swa_blocks = kStepMaxChunks * kStepR * c.swa_blocks_per_request();
  c.cache.compressed_blocks = kStepMaxChunks * kStepR * c.compressed_blocks_per_request();
  return c;
}

void make_step(const model::PipelineConfig& c, int chunks, BenchStep& out, int last_requests) {
  SPG_EXPECTS(chunks >= 1 && chunks <= kStepMaxChunks,
              "make_step: chunks = " << chunks << " must be in [1, " << kStepMaxChunks << "]");
  SPG_EXPECTS(last_requests >= 1 && last_requests <= kStepR,
              "make_step: last_requests = " << last_requests << " must be in [1, " << kStepR << "]");
  const int n = (chunks - 1) * kStepR + last_requests;
  const int per_swa = c.swa_blocks_per_request();
  const int per_comp = c.compressed_blocks_per_request();
  out.swa.resize(static_cast<std::size_t>(n));
  out.comp.resize(static_cast<std::size_t>(n));
  for (int b = 0; b < n; ++b) {
    for (int i = 0; i < per_swa; ++i) out.swa[static_cast<std::size_t>(b)].push_back(b * per_swa + i);
    for (int i = 0; i < per_comp; ++i) out.comp[static_cast<std::size_t>(b)].push_back(b * per_comp + i);
  }
  for (int b = 0; b < n; ++b) {
    graphs::RequestInput r;
    r.query_len = kStepQuery;
    r.seq_len = kStepPrefix + kStepQuery;
    r.swa_blocks = out.swa[static_cast<std::size_t>(b)];
    for (int i = 1; i < graphs::kNumRatios; ++i) r.compressed_blocks[i] = out.comp[static_cast<std::size_t>(b)];
    out.requests.push_back(r);
  }
}

}  // namespace spg::bench
