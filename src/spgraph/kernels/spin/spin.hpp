// Spin: one thread that keeps the device busy for a given time, so that launches behind it queue
// and the host runs ahead of the device. The staging hazard tests and the bench's load probes use
// it (support code: not part of the installed library).
#pragma once

#include <cuda_runtime_api.h>

namespace spg::kernels {

/// Launches one thread on `stream` that spins for `ns` nanoseconds of the device's global timer.
/// Returns the launch's error (cudaGetLastError).
cudaError_t launch_spin(unsigned long long ns, cudaStream_t stream) noexcept;

/// Launches one thread on `stream` that waits until the word at `gate` (page-locked host memory,
/// read with system scope) is at least `open`, or until `timeout_ns` of the device's global timer
/// have passed: the host enqueues work behind it and then stores `open`, so the device starts
/// that work only once all of it is enqueued, from an idle state. The timeout keeps a host that
/// never opens the gate from blocking the stream for good. Returns the launch's error.
cudaError_t launch_gate(const unsigned* gate, unsigned open, unsigned long long timeout_ns, cudaStream_t stream) noexcept;

}  // namespace spg::kernels
