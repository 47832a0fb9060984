// Checksum: an order-sensitive 64-bit sum of a buffer's 32-bit words, accumulated on the device.
// Drivers and tests use it to compare whole runs bit for bit (graph replay against eager
// launches) without copying every output to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace spg::kernels {

struct Checksum {
  /// Adds sum_i word[i] * (2 * (i + salt) + 1) (mod 2^64) over the `bytes / 4` words of `data` to
  /// `*acc`. `data` must be 4-byte aligned and `bytes` a multiple of 4. Captures in a graph.
  static cudaError_t accumulate(const void* data, std::size_t bytes, std::uint64_t salt, std::uint64_t* acc,
                                cudaStream_t stream) noexcept;
};

}  // namespace spg::kernels
