// Pipeline: the stages of one chunk for one layer program, prepared for one chunk shape and
// recorded onto a stream, eagerly or under capture (docs/graphs.md).
//
// Per layer: insert (optional) -> gather compressed + window -> combine -> attention, all layers
// sharing one kv workspace. The recording starts with the stage-in kernel (the step's metadata
// from the pinned staging block to its device block, and the fault-counter reset), so the host's
// only per-step work is to fill the staging block and launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "kernels/combine_indices/combine_indices.hpp"
#include "kernels/kv_cache/kv_cache.hpp"
#include "kernels/sparse_mla/sparse_mla.hpp"
#include "kernels/stage_in/stage_in.hpp"
#include "memory/buffer_pool.hpp"
#include "memory/pipeline_config.hpp"
#include "memory/pipeline_pool.hpp"

namespace spg::graphs {

/// @brief Kernel arguments of every stage of one layer, for one chunk shape.
struct LayerLaunches {
  bool insert_swa{false};
  bool insert_compressed{false};
  kernels::KvInsertArgs swa_insert{};
  kernels::KvInsertArgs compressed_insert{};
  kernels::KvGatherArgs gather{};
  kernels::CombineIndicesArgs combine{};
  kernels::SparseMlaArgs attention{};
  bool attention_split{false};  ///< the split-top-k path: partial and merge kernels
};

/// @brief A layer program's stages prepared for one (R_bucket, T_bucket).
class Pipeline {
 public:
  /// Builds and checks every stage's arguments against the pool's slots (can_implement on each).
  /// `attention_workspace` must hold attention_workspace_bytes() for this shape.
  /// @throws InvalidArgument / CapacityError when a stage cannot run this shape.
  Pipeline(const memory::PipelineConfig& config, const memory::BufferPool& pool, const std::vector<int>& layers,
           int r_bucket, int t_bucket, bool insert, void* attention_workspace);

  /// Bytes of attention workspace the widest layer of `layers` needs at this shape.
  [[nodiscard]] static std::size_t attention_workspace_bytes(const memory::PipelineConfig& config,
                                                             const std::vector<int>& layers, int r_bucket,
                                                             int t_bucket);

  /// Records the step onto `stream`: stage-in from staging block `staging` (0 or 1), then every
  /// layer's stages. No allocation, no sync: safe under capture.
  [[nodiscard]] cudaError_t record(int staging, cudaStream_t stream) const noexcept;

  /// Stages one at a time, for timing each kernel on its own: stage 0 is the stage-in kernel
  /// (metadata copy and fault reset), then five per layer (SWA insert, compressed insert, gather, combine, attention);
  /// a stage the layer does not have records nothing.
  [[nodiscard]] int stage_count() const noexcept { return 1 + 5 * static_cast<int>(layers_.size()); }
  [[nodiscard]] cudaError_t record_stage(int stage, int staging, cudaStream_t stream) const noexcept;

  [[nodiscard]] int r_bucket() const noexcept { return r_bucket_; }
  [[nodiscard]] int t_bucket() const noexcept { return t_bucket_; }
  /// Kernel launches one step makes (the graph's kernel nodes).
  [[nodiscard]] int kernel_launches() const noexcept;

 private:
  int r_bucket_;
  int t_bucket_;
  std::vector<LayerLaunches> layers_;
  void* attention_workspace_;
  const std::byte* staging_[2];
  std::byte* device_meta_;
  std::size_t meta_bytes_;
  kernels::StepStatus* status_;
};

}  // namespace spg::graphs
