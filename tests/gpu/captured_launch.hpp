// CapturedLaunch: a test's launches captured once into a graph and replayed, on the project's own
// capture guard and graph owners (src/spgraph/graphs/graph.hpp), so an aborted capture is always ended.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/graph.hpp"

namespace spg::test {

/// @brief Captures `record` (launches on `stream`, returning their status) into a graph,
///        thread-local mode, and replays it. A failed launch throws CudaError.
class CapturedLaunch {
 public:
  CapturedLaunch(cudaStream_t stream, const std::function<cudaError_t()>& record) {
    graphs::CaptureGuard guard(stream);
    SPG_CUDA_TRY(record());
    exec_ = graphs::GraphExec::instantiate(guard.finish(), stream);
  }

  /// Launches the graph and waits for it.
  void replay(cudaStream_t stream) const {
    SPG_CUDA_TRY(exec_.launch(stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
  }

 private:
  graphs::GraphExec exec_;
};

}  // namespace spg::test
