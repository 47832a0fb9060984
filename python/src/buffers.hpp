// The executor's buffers across the Python boundary, zero-copy both ways: engine-owned DLPack
// arrays (torch tensors, ...) bound into graphs::LayerBuffers, and every buffer of an executor
// (bound or pooled) handed back as an array that keeps its owner alive. docs/python.md, "The
// executor"; the binding contract: docs/memory.md, "Engine-owned buffers".
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::python {

/// @brief Engine-owned arrays as bindings: one LayerBuffers per layer (or none) and the arrays
///        themselves, which must outlive whatever captures their addresses.
struct BoundBuffers {
  std::vector<graphs::LayerBuffers> layers;
  std::vector<nanobind::object> arrays;
  int device{-1};  ///< the CUDA device of the arrays (-1: none bound)
};

/// @brief Reads `buffers` (None, or one entry per layer: None, a dict {name: array} or an object
///        with the buffer names as attributes, e.g. an Executor's layer views) into bindings.
///        Token strides, block strides and block counts are taken from the arrays (caches: uint8
///        [num_blocks, block_stride], [num_blocks, ...] with each block's bytes contiguous, or flat
///        [num_blocks * block_stride] at the smallest stride). Checks here: dtype (TypeError), rank,
///        negative strides, devices (ValueError, "buffers[l].name..."); the rest is
///        graphs::check_binding_shapes' and the executor's.
BoundBuffers bound_buffers(const model::PipelineConfig& config, nanobind::handle buffers);

/// @brief What the views are returned as: DLPack arrays (nanobind's, any framework takes them
///        through from_dlpack) or torch tensors.
enum class Framework { dlpack, torch };
Framework framework_arg(nanobind::handle name);

/// @brief Every buffer of a layer as {name: array or None}, each a view whose owner is `owner`.
nanobind::dict layer_views(const graphs::LayerBuffers& layer, nanobind::handle owner, int device, Framework fw);
/// @brief The step workspace {kv, combined_indices, combined_lens} as views owned by `owner`.
nanobind::dict workspace_views(const graphs::StepWorkspace& workspace, nanobind::handle owner, int device,
                               Framework fw);

/// @brief Registers check_buffers and plan_bound (planning and the binding checks without a GPU).
void bind_buffers(nanobind::module_& m);

}  // namespace spg::python
