// What an engine brings to the executor: its own caches and tensors, each from a plain
// cudaMalloc, bound into the executor instead of being planned in spgraph's pool
// (serve_loop --engine-buffers, table D's pool sizes). docs/memory.md, "Engine-owned buffers".
#pragma once

#include <cstddef>
#include <vector>

#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::samples {

/// @brief Every buffer of every layer of `config` that the layer uses (the K rows only with
///        `insert`), one device allocation each, contiguous, at the config's sizes (rows for a
///        whole step of `step`'s size too, when given).
class EngineBuffers {
 public:
  /// @throws CudaError when an allocation fails.
  EngineBuffers(const model::PipelineConfig& config, bool insert, const graphs::StepBounds& step = {});

  /// One LayerBuffers per layer, every used member bound: ExecutorOptions::buffers.
  [[nodiscard]] const std::vector<graphs::LayerBuffers>& bindings() const noexcept { return bindings_; }
  /// Device bytes held, all layers together.
  [[nodiscard]] std::size_t bytes() const noexcept { return bytes_; }

 private:
  template <class T>
  T* allocate(std::size_t elems);

  std::vector<core::DeviceBuffer> owned_;
  std::vector<graphs::LayerBuffers> bindings_;
  std::size_t bytes_{0};
};

}  // namespace spg::samples
