// CPU reference of a layer step: see pipeline_reference.hpp.
#include "spgraph/kernels/reference/pipeline_reference.hpp"

#include <algorithm>

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/reference/combine_indices_reference.hpp"

namespace spg::kernels::reference {

HostChunk make_host_chunk(std::span<const int> query_lens, std::span<const int> seq_lens, int compress_ratio,
                          int window, int r_bucket) {
  SPG_EXPECTS(query_lens.size() == seq_lens.size() && static_cast<int>(seq_lens.size()) <= r_bucket,
              "make_host_chunk: " << query_lens.size() << " query lens and " << seq_lens.size()
                                  << " seq lens for r_bucket = " << r_bucket);
  HostChunk hc;
  const int n = static_cast<int>(seq_lens.size());
  hc.query_start_loc.assign(static_cast<std::size_t>(r_bucket) + 1, 0);
  hc.seq_lens.assign(static_cast<std::size_t>(r_bucket), 0);
  hc.gather_lens.assign(static_cast<std::size_t>(r_bucket), 0);
  int n_rows = 0;
  int max_gather = 0;
  for (int b = 0; b < r_bucket; ++b) {
    const auto i = static_cast<std::size_t>(b);
    const int q = b < n ? query_lens[i] : 0;
    const int s = b < n ? seq_lens[i] : 0;
    hc.query_start_loc[i + 1] = hc.query_start_loc[i] + q;
    hc.seq_lens[i] = s;
    hc.gather_lens[i] = std::min(s, q + window - 1);
    max_gather = std::max(max_gather, hc.gather_lens[i]);
    if (compress_ratio > 1) n_rows = std::max(n_rows, s / compress_ratio);
  }
  hc.scalars = ChunkScalars{n, hc.query_start_loc[static_cast<std::size_t>(r_bucket)], n_rows, n_rows + max_gather, 0, 0, 0, 0};
  return hc;
}

SparseMlaReferenceOutputs layer_step_reference(const LayerStepInputs& in, FaultLog& log, LayerStepIntermediates* keep) {
  SPG_EXPECTS(in.layer != nullptr, "layer_step_reference: layer is null");
  const model::LayerConfig& layer = *in.layer;
  const int r = layer.compress_ratio;
  const std::int64_t rows = in.r_bucket * in.max_rows_per_request;
  std::vector<std::uint16_t> kv(static_cast<std::size_t>(rows) * model::kHeadDim, 0);
  if (r > 1) {
    kv_gather(in.compressed, in.swa, in.chunk, GatherPart::both, r, in.r_bucket, in.max_rows_per_request, kv.data(),
              log);
  } else {
    kv_gather(in.swa, in.swa, in.chunk, GatherPart::window, r, in.r_bucket, in.max_rows_per_request, kv.data(), log);
  }
  const int width = layer.combined_width();
  std::vector<std::int32_t> combined(static_cast<std::size_t>(in.t_bucket) * width, -1);
  std::vector<std::int32_t> lens(static_cast<std::size_t>(in.t_bucket), 0);
  combine_indices(r > 1 ? in.topk : nullptr, layer.top_k, r, layer.window, in.chunk, in.t_bucket, in.r_bucket,
                  combined.data(), width, lens.data(), log);

  // Only the sampled tokens' query rows are widened; q_row_of_token maps each token to its row.
  std::vector<int> all;
  std::span<const int> tokens = in.tokens;
  if (tokens.empty()) {
    all.resize(static_cast<std::size_t>(in.t_bucket));
    for (int t = 0; t < in.t_bucket; ++t) all[static_cast<std::size_t>(t)] = t;
    tokens = all;
  }
  const std::size_t row = static_cast<std::size_t>(layer.h_q) * layer.d_qk;
  std::vector<float> q(tokens.size() * row);
  std::vector<std::int32_t> q_row(static_cast<std::size_t>(in.t_bucket), 0);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<std::size_t>(tokens[i]);
    q_row[t] = static_cast<std::int32_t>(i);
    for (std::size_t k = 0; k < row; ++k) q[i * row + k] = bf16_value(in.q[t * row + k]);
  }
  std::vector<float> kvf(kv.size());
  for (std::size_t i = 0; i < kv.size(); ++i) kvf[i] = bf16_value(kv[i]);

  SparseMlaReferenceInputs a;
  a.q = q;
  a.kv = kvf;
  a.indices = combined;
  a.topk_length = lens;
  a.attn_sink = in.attn_sink;
  a.s_q = in.t_bucket;
  a.s_kv = static_cast<int>(rows);
  a.h_q = layer.h_q;
  a.d_qk = layer.d_qk;
  a.topk = width;
  a.sm_scale = layer.scale();
  a.num_tokens = in.chunk.scalars.num_tokens;
  a.q_row_of_token = q_row;
  SparseMlaReferenceOutputs out = sparse_mla_reference(a, tokens);
  if (keep != nullptr) *keep = LayerStepIntermediates{std::move(kv), std::move(combined), std::move(lens)};
  return out;
}

}  // namespace spg::kernels::reference
