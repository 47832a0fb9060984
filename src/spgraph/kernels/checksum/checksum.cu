// Host side of Checksum (see checksum.hpp).
#include "spgraph/kernels/checksum/checksum.hpp"

#include "spgraph/kernels/checksum/checksum_kernel.cuh"

namespace spg::kernels {

cudaError_t Checksum::accumulate(const void* data, std::size_t bytes, std::uint64_t salt, std::uint64_t* acc,
                                 cudaStream_t stream) noexcept {
  const std::size_t n = bytes / 4;
  if (n == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 528 ? n / 256 + 1 : 528);
  detail::checksum_kernel<<<blocks, 256, 0, stream>>>(static_cast<const std::uint32_t*>(data), n, salt,
                                                     reinterpret_cast<unsigned long long*>(acc));
  return cudaGetLastError();
}

}  // namespace spg::kernels
