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

#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/kernels/combine_indices/combine_indices.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/kernels/stage_in/stage_in.hpp"
#include "spgraph/kernels/sparse_mla/sparse_mla.hpp"
#include "spgraph/kernels/step_status.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

/// @brief The stages of one layer, in recording order (docs/pipeline.md numbers the same work
///        0 insert, 1-2 gather, 3 combine, 4 attention; one gather launch does stages 1 and 2).
enum class Stage : int { insert_swa, insert_compressed, gather, combine, attention };
inline constexpr Stage kStages[] = {Stage::insert_swa, Stage::insert_compressed, Stage::gather, Stage::combine,
                                    Stage::attention};
[[nodiscard]] const char* stage_name(Stage s) noexcept;

/// @brief Everything a Pipeline records into: the per-step metadata, the shared workspaces and
///        every layer's buffers (bound or pooled).
struct PipelineBuffers {
  const std::byte* staging[2]{nullptr, nullptr};  ///< pinned staging blocks of the metadata
  kernels::StagingRelease release[2]{};           ///< each staging block's release to the host (none: all null)
  std::int32_t* chunk_meta{nullptr};              ///< the device metadata block
  kernels::StatusBlock* status{nullptr};           ///< the step's fault counters and the run's totals
  StepWorkspace workspace;
  void* attention_workspace{nullptr};             ///< attention_workspace_bytes() for the shape
  const std::vector<LayerBuffers>* layers{nullptr};  ///< one per layer of the config
};

/// @brief Kernel arguments of every stage of one layer, for one chunk shape.
struct LayerLaunches {
  int layer{-1};  ///< the layer's index in the config
  bool insert_swa{false};
  bool insert_compressed{false};
  kernels::KvInsertArgs swa_insert{};
  kernels::KvInsertArgs compressed_insert{};
  kernels::KvGatherArgs gather{};
  kernels::CombineIndicesArgs combine{};
  kernels::SparseMlaArgs attention{};
  kernels::SparseMlaLaunch attention_launch;  ///< `attention` prepared (SparseMla::initialize)
  bool attention_split{false};  ///< the split-top-k path: partial and merge kernels
};

/// @brief A layer program's stages prepared for one (R_bucket, T_bucket).
class Pipeline {
 public:
  /// Builds and checks every stage's arguments (can_implement on each). `step_rows`: a body of the
  /// step graph, whose stages read and write the chunk's rows of the step's buffers, at the offsets
  /// its metadata holds (ChunkScalars::token_offset, new_row_offset; padded tokens write no
  /// output); else a chunk run alone, on rows from 0 (docs/graphs.md, "Steps").
  /// @throws InvalidArgument / CapacityError when a stage cannot run this shape.
  Pipeline(const model::PipelineConfig& config, const PipelineBuffers& buffers, const std::vector<int>& layers,
           int r_bucket, int t_bucket, bool insert, bool step_rows = false);

  /// Bytes of attention workspace the widest layer of `layers` needs at this shape.
  [[nodiscard]] static std::size_t attention_workspace_bytes(const model::PipelineConfig& config,
                                                             const std::vector<int>& layers, int r_bucket,
                                                             int t_bucket);

  /// Records the step onto `stream`: stage-in from staging block `staging` (0 or 1), then every
  /// layer's stages. No allocation, no sync: safe under capture.
  [[nodiscard]] cudaError_t record(int staging, cudaStream_t stream) const noexcept;
  /// Every layer's stages without the stage-in: a chunk's body inside a step graph, after the
  /// step's chunk stage-in has filled the metadata block (src/spgraph/graphs/step.hpp).
  [[nodiscard]] cudaError_t record_layers(cudaStream_t stream) const noexcept;

  /// One stage at a time, for timing each kernel on its own: the stage-in kernel (metadata copy
  /// and fault reset), and stage `s` of the program's `layer`-th layer (a stage the layer does not
  /// have records nothing).
  [[nodiscard]] cudaError_t record_stage_in(int staging, cudaStream_t stream) const noexcept;
  [[nodiscard]] cudaError_t record_stage(std::size_t layer, Stage s, cudaStream_t stream) const noexcept;
  [[nodiscard]] std::size_t layer_count() const noexcept { return layers_.size(); }

  [[nodiscard]] int r_bucket() const noexcept { return r_bucket_; }
  [[nodiscard]] int t_bucket() const noexcept { return t_bucket_; }
  [[nodiscard]] bool step_rows() const noexcept { return step_rows_; }
  /// Kernel launches one step makes: the graph's kernel nodes (the stage-in kernel included).
  [[nodiscard]] int kernel_launches() const noexcept;
  /// The prepared arguments of the program's `layer`-th layer.
  [[nodiscard]] const LayerLaunches& launches(std::size_t layer) const { return layers_.at(layer); }

 private:
  int r_bucket_;
  int t_bucket_;
  bool step_rows_;
  std::vector<LayerLaunches> layers_;
  const std::byte* staging_[2];
  kernels::StagingRelease release_[2];
  std::byte* device_meta_;
  std::size_t meta_bytes_;
  kernels::StatusBlock* status_block_;
  kernels::StepStatus* status_;  // &status_block_->step: what every op counts its faults in
};

}  // namespace spg::graphs
