// Device code of Checksum (see checksum.hpp).
#pragma once

#include <cstdint>

namespace spg::kernels::detail {

__global__ void checksum_kernel(const std::uint32_t* words, std::size_t n, std::uint64_t salt, unsigned long long* acc) {
  unsigned long long sum = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    sum += static_cast<unsigned long long>(words[i]) * (2 * (i + salt) + 1);
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xFFFFFFFFU, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(acc, sum);
}

}  // namespace spg::kernels::detail
