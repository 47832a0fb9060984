// Stage-in device code: the fold of a step's fault counters into the run's totals, shared by the
// chunk stage-in (stage_in.cu) and the step loop's head (src/spgraph/kernels/step_loop).
#pragma once

#include <cstdint>

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

}  // namespace spg::kernels::detail
