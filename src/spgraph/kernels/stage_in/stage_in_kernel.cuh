// Stage-in device code: the fold of a step's fault counters into the run's totals, shared by the
// chunk stage-in (stage_in.cu) and the step loop's head (src/spgraph/kernels/step_loop), and the
// release of a staging block to the host once the launch has read it (StagingRelease).
#pragma once

#include <cuda/atomic>

#include <cstdint>

#include "spgraph/kernels/stage_in/stage_in.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels::detail {

/// The previous step (stream or graph order: it has completed) left its counts in status->step:
/// adds them into the run's totals, then starts this step at zero. One thread, ~20 words.
__device__ inline void fold_step_faults(StatusBlock* status) {
  StepStatus& step = status->step;
  RunFaults& run = status->run;
  std::uint32_t any = 0;
  for (int k = 0; k < kFaultKinds; ++k) {
    run.counts[k] += step.counts[k];
    any |= step.counts[k];
    step.counts[k] = 0;
  }
  if (any != 0) ++run.faulty_steps;
  if (run.recorded == 0 && step.recorded != 0) {
    run.first = step.first;
    run.recorded = 1;
  }
  step.recorded = 0;
  step.first = FaultRecord{0, 0, 0, 0};
}

/// The launch's sequence number for its staging block (what the host wrote before launching), or 0
/// without a release. Read at the kernel's start, beside its copy, so its bus round trip overlaps.
__device__ inline std::uint32_t staging_sequence(const StagingRelease& r) {
  if (r.released == nullptr) return 0;
  return cuda::atomic_ref<const std::uint32_t, cuda::thread_scope_system>(*r.sequence).load(cuda::memory_order_relaxed);
}

/// Called by every thread of the kernel that reads the staging block last in a launch, after its
/// last read of the block (`last`: this launch of the kernel is that reader, the same value in every
/// thread). Every thread's loads have returned once it passes __syncthreads (each load fed a store
/// it issued); the last CTA to arrive then stores `sequence` into the host-mapped word with
/// system-scope release, and the host may rewrite the block (docs/graphs.md, "The staging hazard").
__device__ inline void release_staging(const StagingRelease& r, std::uint32_t sequence, bool last) {
  if (r.released == nullptr || !last) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  __threadfence();
  if (gridDim.x > 1 && atomicAdd(r.arrivals, 1U) != gridDim.x - 1) return;
  if (gridDim.x > 1) *r.arrivals = 0;  // every CTA has arrived: ready for the next launch
  cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system>(*r.released).store(sequence, cuda::memory_order_release);
}

}  // namespace spg::kernels::detail
