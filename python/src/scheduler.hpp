// The scheduler and the synthetic workload from Python: see scheduler.cpp.
#pragma once

#include <nanobind/nanobind.h>

namespace spg::python {

/// @brief Registers Request, make_workload, ChunkPlan, StepPlan and PrefillScheduler.
void bind_scheduler(nanobind::module_& m);

}  // namespace spg::python
