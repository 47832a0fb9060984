// CPU reference of stage 3: see combine_indices_reference.hpp.
#include "spgraph/kernels/reference/combine_indices_reference.hpp"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <vector>

namespace spg::kernels::reference {

void combine_indices(const std::int32_t* topk_indices, int top_k, int compress_ratio, int window,
                     const HostChunk& chunk, int tokens_bucket, int requests_bucket, std::int32_t* combined,
                     int combined_width, std::int32_t* lens, FaultLog& log) {
  const ChunkScalars& sc = chunk.scalars;
  const int nr = sc.num_requests;
  bool chunk_ok = nr >= 0 && nr <= requests_bucket && sc.num_tokens >= 0 && sc.num_tokens <= tokens_bucket &&
                  sc.n_rows >= 0 && sc.n_rows <= sc.m_rows &&
                  sc.m_rows <= std::numeric_limits<std::int32_t>::max() / requests_bucket;
  const auto& qsl = chunk.query_start_loc;
  if (chunk_ok) {
    chunk_ok = qsl[0] == 0 && qsl[static_cast<std::size_t>(nr)] == sc.num_tokens;
    for (int b = 0; b < nr; ++b) chunk_ok = chunk_ok && qsl[b] <= qsl[b + 1];
  }
  if (!chunk_ok) {
    log.add(Fault::scalars, -1, -1, nr);
    std::fill(lens, lens + tokens_bucket, 0);
    return;
  }
  std::vector<bool> ok(static_cast<std::size_t>(nr));
  for (int b = 0; b < nr; ++b) {
    const int qlen = qsl[b + 1] - qsl[b];
    const int seq = chunk.seq_lens[b];
    const int gather = chunk.gather_lens[b];
    // The window rows the tokens index must have been gathered: gather_len >= min(seq, qlen + W - 1).
    ok[b] = qlen == 0 || (qlen <= seq && gather >= std::min(seq, qlen + window - 1) && gather <= seq &&
                          sc.n_rows + gather <= sc.m_rows && (compress_ratio == 1 || seq / compress_ratio <= sc.n_rows));
    if (!ok[b]) log.add(Fault::seq_len, b, gather, seq);
  }
  for (int t = 0; t < tokens_bucket; ++t) {
    lens[t] = 0;
    if (t >= sc.num_tokens) continue;
    int b = 0;
    while (!(qsl[b] <= t && t < qsl[b + 1])) ++b;
    if (!ok[b]) continue;
    const int seq = chunk.seq_lens[b];
    const int qlen = qsl[b + 1] - qsl[b];
    const int pos = seq - qlen + (t - qsl[b]);
    const int topk_len = compress_ratio > 1 ? std::min((pos + 1) / compress_ratio, top_k) : 0;
    const int swa_len = std::min(pos + 1, window);
    const int gather_start = seq - chunk.gather_lens[b];
    const int rows = seq / compress_ratio;
    std::int32_t* out = combined + static_cast<std::ptrdiff_t>(t) * combined_width;
    for (int j = 0; j < topk_len; ++j) {
      const std::int32_t v = topk_indices[static_cast<std::ptrdiff_t>(t) * top_k + j];
      if (v == -1) {
        out[j] = -1;  // "none" stays -1: -1 + M * b would index request b's own rows
      } else if (v >= 0 && v < rows) {
        out[j] = v + sc.m_rows * b;
      } else {
        out[j] = -1;
        log.add(Fault::topk_index, b, t, v);
      }
    }
    for (int j = 0; j < swa_len; ++j) {
      out[topk_len + j] = sc.m_rows * b + sc.n_rows + (pos - swa_len + 1 - gather_start) + j;
    }
    lens[t] = topk_len + swa_len;
  }
}

}  // namespace spg::kernels::reference
