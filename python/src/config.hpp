// The configurations of the Python package: spgraph.PipelineConfig (with its LayerConfig and
// CacheConfig), spgraph.SchedulerConfig and spgraph.WorkloadConfig are Python dataclasses
// (python/spgraph/config.py) whose defaults come from here, and which are read back into the C++
// structs by attribute, so any object with the same attributes works. The planner without a GPU
// (plan_pipeline_pool, the buckets) is bound here too. docs/python.md, "The executor".
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "spgraph/memory/pool_plan.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"
#include "spgraph/scheduler/workload.hpp"

namespace spg::python {

/// @brief The C++ config of a spgraph.PipelineConfig (or any object with its attributes).
/// @throws nb::type_error for a missing attribute or a value of the wrong type, nb::value_error
///         for an int outside int32; not validated (PipelineConfig::validate does that).
model::PipelineConfig pipeline_config(nanobind::handle config);
/// @brief The keyword arguments of spgraph.PipelineConfig for a C++ config (layers and cache as dicts).
nanobind::dict config_dict(const model::PipelineConfig& config);

/// @brief A pool plan as {'slots': [{name, kind, shape, bytes, offset, alignment}], 'device_bytes',
///        'pinned_bytes', 'table'} (the table is PoolPlan::table(), as serve_loop --plan prints it).
nanobind::dict plan_dict(const memory::PoolPlan& plan);

scheduler::SchedulerConfig scheduler_config(nanobind::handle config);
scheduler::WorkloadConfig workload_config(nanobind::handle config);

/// @brief Registers the config helpers and the planner on the extension module.
void bind_config(nanobind::module_& m);

}  // namespace spg::python
