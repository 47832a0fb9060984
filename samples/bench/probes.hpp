// Probes that give the benchmark tables their scale: the host cost of cudaGraphLaunch by graph
// shape (behind the executor's host time per step, table B) and a plain copy kernel (behind the
// gather's bandwidth, table C).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

#include "samples/bench/report.hpp"
#include "spgraph/graphs/graph.hpp"

namespace spg::bench {

/// Records suite "executor", name "launch-probe/<lead>/<K> kernels", metrics host_launch_us and
/// host_record_us (medians of single launches on an idle device).
/// Straight-line graphs of K empty kernels, led by nothing, by a pinned-to-device copy node, or
/// by a kernel that reads the pinned block itself; then the property probes (idle device), and
/// the load probe ("launch-probe/load/...": idle against busy, one property at a time).
/// Then run_loop_probe.
void run_launch_probe(Reporter& reporter);

/// The property probes alone (`bench --tables L`, part of D): rows "launch-probe/property/<p>",
/// metric host_launch_us: cudaGraphLaunch of 40 empty kernels, plain, with one property of the
/// real graphs at a time (programmatic edges, a tensor-map parameter, 2 KiB parameters, 40 distinct
/// kernels), all four, and as 20 forks and joins (merge nodes), on an idle device.
void run_property_probes(Reporter& reporter);

/// The loop probe (`bench --tables L` alone, part of D): rows "launch-probe/loop/<variant>/<k>
/// chunks" (6-kernel bodies) and "launch-probe/loop-48/..." (48), metrics gpu_us_idle,
/// gpu_us_steady, host_launch_us, host_launch_us_after_launch: the GPU and host cost of device-side
/// chunk loops of several structures (docs/benchmarks.md, "Which loop structure costs least per
/// chunk"). @throws StateError if a structure ran the wrong count of body kernels; CudaError.
void run_loop_probe(Reporter& reporter);

/// @brief Host microseconds of one launch, medians: on an idle device (synchronized after each),
///        busy (16 launches back to back behind a 3 ms spin, the device behind the host), and
///        right after a launch of exec 0 on an idle device (exec 0 again with one exec, so its
///        previous launch is running; exec 1 with two).
struct LaunchLoad {
  double idle_us{0};
  double busy_us{0};
  double running_us{0};
};
/// Times `launch(i)` (i cycles over [0, execs)) idle, then busy, on `stream`. @throws CudaError.
LaunchLoad measure_launch_load(const std::function<cudaError_t(int)>& launch, cudaStream_t stream, int execs);

/// A one-node graph whose kernel tail-launches `device_exec` (instantiated with
/// cudaGraphInstantiateFlagDeviceLaunch and uploaded) and writes the device-side cudaGraphLaunch's
/// status (0: cudaSuccess) to the device int `status`. @throws CudaError.
graphs::GraphExec make_tail_launcher(cudaGraphExec_t device_exec, int* status, cudaStream_t stream);

/// Launches a kernel that reads `rows` rows of 576 bytes from `src` and writes `rows` rows of 1024
/// bytes to `dst`: the gather's read/write mix with no indirection and no conversion.
cudaError_t launch_stream_rows_kernel(void* dst, const void* src, int rows, cudaStream_t stream) noexcept;

/// Launches a 16-byte-per-access grid-stride copy of `bytes` (a multiple of 16) on `stream`.
cudaError_t launch_copy_kernel(void* dst, const void* src, std::size_t bytes, cudaStream_t stream) noexcept;

}  // namespace spg::bench
