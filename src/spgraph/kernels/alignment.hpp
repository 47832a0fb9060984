// The alignment check every launcher makes on the pointers it is handed (host code).
#pragma once

#include <cstddef>
#include <cstdint>

namespace spg::kernels {

/// Whether `p` is a multiple of `bytes` (a power of two or not).
[[nodiscard]] inline bool aligned(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace spg::kernels
