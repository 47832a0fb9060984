// Stage-in: the first node of every step. One kernel copies the step's metadata block from the
// pinned staging block (host memory the device reads over the bus) to its device block, adds the
// previous step's fault counters into the run's totals and zeroes them (src/spgraph/kernels/step_status.hpp). A graph launch costs the host about 1.2 us less with this one kernel
// node than with a copy node and a memset node (docs/benchmarks.md, B, "Host time and CUPTI").
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels {

/// @brief How a launch tells the host it has read its staging block, without a CUDA event: the
///        host writes the launch's sequence number into `sequence` before launching; the kernel
///        that reads the block last stores it into `released` once every CTA's reads have returned
///        (docs/graphs.md, "The staging hazard"). All null: no release (standalone calls).
struct StagingRelease {
  const std::uint32_t* sequence{nullptr};  ///< pinned host word, written by the host
  std::uint32_t* released{nullptr};        ///< pinned host word, written by the device (system scope)
  std::uint32_t* arrivals{nullptr};        ///< device word, zero between launches: CTAs done reading
};

struct StageIn {
  /// @throws InvalidArgument for a null or misaligned pointer (16 bytes), `bytes` not a positive
  ///         multiple of 16, or a `staging` block the device cannot address (not pinned host memory
  ///         or device memory), or a `release` with some of its words null but not all.
  static void can_implement(const void* staging, const void* meta, std::size_t bytes, const StatusBlock* status,
                            const StagingRelease& release = {});
  /// Launches the copy of `bytes` from `staging` to `meta`, the fold of status->step into
  /// status->run and the reset of status->step, then the staging block's `release`; allocates and
  /// syncs nothing. Returns cudaGetLastError() after the launch.
  static cudaError_t run(const void* staging, void* meta, std::size_t bytes, StatusBlock* status, cudaStream_t stream,
                         const StagingRelease& release = {}) noexcept;
};

}  // namespace spg::kernels
