// A kernel that keeps the device busy for a while, so that launches behind it queue and the host
// runs ahead of the device (the staging hazard tests).
#pragma once

#include <cuda_runtime_api.h>

namespace spg::test {

/// Launches one thread that spins for `ns` nanoseconds of the device's global timer on `stream`.
cudaError_t launch_spin(unsigned long long ns, cudaStream_t stream) noexcept;

}  // namespace spg::test
