// The pipeline's pool plan: every slot a layer program needs and the caller did not bind, sized
// from a PipelineConfig.
//
// Slot formulas are written out in docs/memory.md; this file is their one implementation. Slot
// names are the planner's: callers reach every buffer through Executor::layer() and
// Executor::workspace(), never by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/kernels/step_status.hpp"
#include "spgraph/memory/pool_plan.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

/// Slot names of the pipeline pool (docs/memory.md lists them with their formulas).
namespace slots {
inline constexpr const char* kChunkMeta = "chunk_meta";
inline constexpr const char* kStepStatus = "step_status";
inline constexpr const char* kKvWorkspace = "kv_workspace";
inline constexpr const char* kCombined = "combined_indices";
inline constexpr const char* kCombinedLens = "combined_lens";
inline constexpr const char* kStaging[2] = {"staging0", "staging1"};
/// The staging release words (pinned): a sequence number per staging block written by the host,
/// then one per block written by the device once a launch has read it (docs/graphs.md, "The
/// staging hazard"); the chunk blocks 0, 1 and the step blocks 0, 1.
inline constexpr const char* kStagingRelease = "staging_release";
inline constexpr const char* kAttentionWorkspace = "attention_workspace";
/// Steps only (ExecutorOptions::max_step_requests > 0): the step staging blocks, the device
/// step state and the device step blocks (src/spgraph/graphs/step.hpp).
inline constexpr const char* kStepStaging[2] = {"step_staging0", "step_staging1"};
inline constexpr const char* kStepState = "step_state";
inline constexpr const char* kStepMeta = "step_meta";
/// A layer's slot: layer_slot(3, LayerBuffer::q) == "layer3.q".
[[nodiscard]] std::string layer_slot(std::size_t layer, LayerBuffer b);
}  // namespace slots

/// Bytes reserved for the fault counters: the step's and the run's (kernels::StatusBlock).
inline constexpr std::size_t kStepStatusBytes = 256;
inline constexpr std::size_t kStagingReleaseBytes = 2 * 4 * sizeof(std::uint32_t);
static_assert(sizeof(kernels::StatusBlock) <= kStepStatusBytes, "the status slot must hold a StatusBlock");

/// @brief The widest combined-index row over the program: round_up(top_k + W, 128).
[[nodiscard]] int max_combined_width(const model::PipelineConfig& config) noexcept;
/// @brief M_max over the program: the kv workspace's rows per request.
[[nodiscard]] std::int64_t max_kv_rows(const model::PipelineConfig& config) noexcept;

/// Plans every slot of the pipeline for `config` (validated first) that `bound` does not bind
/// (one LayerBuffers per layer, or none: everything pooled). With `insert` false the K rows the
/// insert stage reads are not planned. `step`: the largest step, which the row-indexed layer
/// buffers must also hold (required_rows).
/// @throws InvalidArgument from PipelineConfig::validate(), or when `bound` has neither 0 nor one
///         entry per layer.
[[nodiscard]] memory::PoolPlan plan_pipeline_pool(const model::PipelineConfig& config,
                                                  const std::vector<LayerBuffers>& bound = {}, bool insert = true,
                                                  const StepBounds& step = {});
/// The same with the bound buffers named by a predicate (layer, buffer) -> bound: what the pool
/// would hold for a binding that does not exist yet (serve_loop --plan --engine-buffers).
[[nodiscard]] memory::PoolPlan plan_pipeline_pool(const model::PipelineConfig& config,
                                                  const std::function<bool(std::size_t, LayerBuffer)>& is_bound,
                                                  bool insert, const StepBounds& step = {});

}  // namespace spg::graphs
