// Host side of stage 3: argument checks and the launch (see combine_indices.hpp).
#include "spgraph/kernels/combine_indices/combine_indices.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/alignment.hpp"
#include "spgraph/kernels/combine_indices/combine_indices_kernel.cuh"

namespace spg::kernels {

namespace {
}  // namespace

void CombineIndices::can_implement(const CombineIndicesArgs& a) {
  // tokens_bucket = 0 is a call with no work (run() launches nothing): the per-token arrays and,
  // with requests_bucket = 0, the per-request ones may be empty, so null.
  const bool empty = a.tokens_bucket == 0;
  const int r = a.compress_ratio;
  SPG_EXPECTS(r == 1 || r == 4 || r == 128, "compress_ratio = " << r << " must be 1, 4 or 128");
  if (r == 1) {
    SPG_EXPECTS(a.top_k == 0, "top_k = " << a.top_k << " must be 0 when compress_ratio = 1 (SWA-only layer)");
  } else {
    SPG_EXPECTS(a.top_k >= 1 && a.top_k <= 65536,
                "top_k = " << a.top_k << " must be in [1, 65536] when compress_ratio = " << r);
    SPG_EXPECTS(empty || a.topk_indices != nullptr, "topk_indices is null (compress_ratio = " << r << ")");
    SPG_EXPECTS(a.topk_row_stride == 0 || a.topk_row_stride >= a.top_k,
                "topk_row_stride = " << a.topk_row_stride << " must be 0 (rows packed) or at least top_k = " << a.top_k);
    const int stride = a.topk_row_stride == 0 ? a.top_k : a.topk_row_stride;
    const std::size_t align = a.top_k % 4 == 0 && stride % 4 == 0 ? 16 : 4;
    SPG_EXPECTS(aligned(a.topk_indices, align), "topk_indices = " << static_cast<const void*>(a.topk_indices)
                                                                  << " must be " << align << "-byte aligned");
  }
  SPG_EXPECTS(a.window >= 1 && a.window <= 65536, "window = " << a.window << " must be in [1, 65536]");
  SPG_EXPECTS(a.combined_width >= a.top_k + a.window && a.combined_width % 4 == 0,
              "combined_width = " << a.combined_width << " must be a multiple of 4 and at least top_k + window = "
                                  << a.top_k + a.window);
  SPG_EXPECTS(a.tokens_bucket >= 0 && a.tokens_bucket <= (1 << 24),
              "tokens_bucket = " << a.tokens_bucket << " must be in [0, 2^24]");
  const int least_requests = empty ? 0 : 1;  // tokens need a request to belong to
  SPG_EXPECTS(a.requests_bucket >= least_requests && a.requests_bucket <= kMaxRequestsBucket,
              "requests_bucket = " << a.requests_bucket << " must be in [" << least_requests << ", "
                                   << kMaxRequestsBucket << "]" << (empty ? "" : " (tokens_bucket > 0)"));
  if (a.chunk.scalars == nullptr) {
    // A standalone call: N and M as its own arguments.
    for (const auto& [arg, name] : {std::pair{a.n_rows, "N"}, std::pair{a.m_rows, "M"}}) {
      SPG_EXPECTS(arg.device == nullptr || aligned(arg.device, 4),
                  name << " = " << static_cast<const void*>(arg.device) << " (device scalar) must be 4-byte aligned");
    }
    if (a.n_rows.device == nullptr) {
      SPG_EXPECTS(a.n_rows.value >= 0, "N = " << a.n_rows.value << " must be at least 0");
    }
    if (a.m_rows.device == nullptr) {
      SPG_EXPECTS(a.m_rows.value >= 0 &&
                      a.m_rows.value <= std::numeric_limits<std::int32_t>::max() / std::max(a.requests_bucket, 1),
                  "M = " << a.m_rows.value << " must be in [0, (2^31 - 1) / requests = "
                         << std::numeric_limits<std::int32_t>::max() / std::max(a.requests_bucket, 1)
                         << "] (combined indices are int32)");
      if (a.n_rows.device == nullptr) {
        SPG_EXPECTS(a.n_rows.value <= a.m_rows.value,
                    "N = " << a.n_rows.value << " must be at most M = " << a.m_rows.value);
      }
    }
  }
  SPG_EXPECTS(empty || a.chunk.query_start_loc != nullptr, "chunk.query_start_loc is null");
  SPG_EXPECTS(empty || a.chunk.seq_lens != nullptr, "chunk.seq_lens is null");
  SPG_EXPECTS(empty || a.chunk.gather_lens != nullptr, "chunk.gather_lens is null");
  SPG_EXPECTS(empty || a.combined != nullptr, "combined is null");
  SPG_EXPECTS(aligned(a.combined, 16), "combined = " << static_cast<const void*>(a.combined) << " must be 16-byte aligned");
  SPG_EXPECTS(empty || a.lens != nullptr, "lens is null");
  SPG_EXPECTS(a.token_offset == nullptr || aligned(a.token_offset, 4), "token_offset must be 4-byte aligned");
  SPG_EXPECTS(a.token_offset == nullptr || a.chunk.scalars != nullptr,
              "token_offset is set but chunk.scalars is null (a standalone call has no step)");
  SPG_EXPECTS(a.token_offset == nullptr || r == 1 || empty || a.topk_rows >= a.tokens_bucket,
              "topk_rows = " << a.topk_rows << " must be at least tokens_bucket = " << a.tokens_bucket
                             << " (token_offset is set)");
}

cudaError_t CombineIndices::run(const CombineIndicesArgs& a, cudaStream_t stream) noexcept {
  if (a.tokens_bucket == 0) return cudaSuccess;  // no tokens: nothing to launch
  const detail::CombineParams p{a.compress_ratio > 1 ? a.topk_indices : nullptr,
                                a.compress_ratio > 1 ? a.top_k : 0,
                                a.compress_ratio,
                                a.window,
                                a.chunk,
                                a.tokens_bucket,
                                a.requests_bucket,
                                a.combined,
                                a.combined_width,
                                a.lens,
                                a.status,
                                a.topk_row_stride == 0 ? a.top_k : a.topk_row_stride,
                                a.token_offset,
                                a.topk_rows,
                                a.n_rows,
                                a.m_rows};
  const int grid = (a.tokens_bucket + detail::kCombineWarps - 1) / detail::kCombineWarps;
  detail::combine_indices_kernel<<<grid, detail::kCombineThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace spg::kernels
