// Host side of the synthetic model front: checks and the launch (see synthetic_front.hpp).
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"

#include "spgraph/core/error.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front_kernel.cuh"

namespace spg::kernels {

void SyntheticFront::can_implement(const SyntheticFrontArgs& a) {
  SPG_EXPECTS(a.num_requests >= 0 && a.num_requests <= kFrontMaxRequests,
              "num_requests = " << a.num_requests << " must be in [0, " << kFrontMaxRequests << "]");
  SPG_EXPECTS(a.num_tokens >= 0 && a.num_tokens == a.query_start_loc[a.num_requests],
              "num_tokens = " << a.num_tokens << " must equal query_start_loc[num_requests] = "
                              << a.query_start_loc[a.num_requests]);
  SPG_EXPECTS(a.num_layers >= 1 && a.num_layers <= kFrontMaxLayers,
              "num_layers = " << a.num_layers << " must be in [1, " << kFrontMaxLayers << "]");
  for (int i = 0; i < a.num_layers; ++i) {
    const FrontLayer& l = a.layers[i];
    SPG_EXPECTS(l.k_rows != nullptr, "layers[" << i << "].k_rows is null");
    if (l.compress_ratio > 1) {
      SPG_EXPECTS(l.compressed_k_rows != nullptr && l.topk_indices != nullptr,
                  "layers[" << i << "]: compressed_k_rows and topk_indices are needed when compress_ratio > 1");
      SPG_EXPECTS(l.top_k >= 8 && l.top_k % 8 == 0, "layers[" << i << "].top_k = " << l.top_k << " must be a multiple of 8");
    }
  }
}

cudaError_t SyntheticFront::run(const SyntheticFrontArgs& a, cudaStream_t stream) noexcept {
  if (a.num_tokens == 0) return cudaSuccess;
  const dim3 grid(264, static_cast<unsigned>(a.num_layers));
  detail::synthetic_front_kernel<<<grid, 256, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t SyntheticFront::fill_cache(std::uint8_t* cache, std::int64_t blocks, int block_size,
                                       std::int64_t block_stride, std::uint64_t seed, cudaStream_t stream) noexcept {
  detail::fill_cache_kernel<<<1056, 256, 0, stream>>>(cache, blocks, block_size, block_stride, seed);
  return cudaGetLastError();
}

cudaError_t SyntheticFront::fill_query(__nv_bfloat16* q, std::size_t elems, std::uint64_t seed, int layer,
                                       cudaStream_t stream) noexcept {
  detail::fill_query_kernel<<<1056, 256, 0, stream>>>(q, elems, seed, layer);
  return cudaGetLastError();
}

}  // namespace spg::kernels
