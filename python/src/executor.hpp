// spgraph._spgraph.Executor: graphs::Executor over engine-owned DLPack arrays, its replay path
// (run, run_eager) with the chunk read by ChunkReader into storage sized once, and typed views of
// every buffer; spgraph.RunResult and spgraph.RunError; check_chunk (the encoder's checks without
// a GPU). The Python classes spgraph.Executor and spgraph.torch.Executor derive from it.
// docs/python.md, "The executor".
#pragma once

#include <nanobind/nanobind.h>

namespace spg::python {

/// @brief Registers Executor, RunResult, RunError and check_chunk on the extension module.
void bind_executor(nanobind::module_& m);

}  // namespace spg::python
