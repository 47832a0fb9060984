// The ops of the Python package, over DLPack arrays (zero-copy): sparse MLA attention, the
// top-k + sliding-window index combine, the FP8 cache insert and the dequant-gather.
//
// Each function checks its arrays (dtype, shape, strides, device), builds the op's C++ arguments,
// runs the op's can_implement, then launches on the caller's stream. Nothing here allocates device
// memory or synchronizes: every output and scratch buffer is the caller's. Semantics:
// docs/pipeline.md; the Python-facing contract: docs/python.md.
#pragma once

#include <nanobind/nanobind.h>

namespace spg::python {

/// @brief Registers the ops and their helpers on the extension module.
void bind_ops(nanobind::module_& m);

}  // namespace spg::python
