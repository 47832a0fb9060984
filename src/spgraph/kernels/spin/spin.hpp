// Spin: one thread that keeps the device busy for a given time, so that launches behind it queue
// and the host runs ahead of the device. The staging hazard tests and the bench's load probes use
// it (support code: not part of the installed library).
#pragma once

#include <cuda_runtime_api.h>

namespace spg::kernels {

/// Launches one thread on `stream` that spins for `ns` nanoseconds of the device's global timer.
/// Returns the launch's error (cudaGetLastError).
cudaError_t launch_spin(unsigned long long ns, cudaStream_t stream) noexcept;

}  // namespace spg::kernels
