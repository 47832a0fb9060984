// A kernel that writes a buffer late, for the tests of programmatic dependent launch: it lets its
// stream's next kernel start at once (griddepcontrol.launch_dependents), then spins, then copies.
// A kernel launched after it that reads the buffer before its griddepcontrol.wait reads the old
// contents.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace spg::test {

/// One buffer to copy: `bytes` (a multiple of 16) from `src` to `dst`, both 16-byte aligned.
struct LateCopy {
  void* dst{nullptr};
  const void* src{nullptr};
  std::size_t bytes{0};
};

/// Launches one CTA that allows its dependents to launch, waits about `spin_cycles` SM cycles,
/// then performs `a` and `b` (either may be empty). Returns cudaGetLastError().
cudaError_t launch_late_copies(const LateCopy& a, const LateCopy& b, long long spin_cycles, cudaStream_t stream);

}  // namespace spg::test
