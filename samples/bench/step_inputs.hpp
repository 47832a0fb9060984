// The steps of table D and of the staging table S (docs/benchmarks.md, "Steps in one launch"):
// the 1-layer and the 8-layer programs' configs and steps of k chunks of 4 requests of 64 new
// tokens after 2048, built once here so that the GPU step benchmark and the host-only staging
// benchmark measure the same steps. Host code only.
#pragma once

#include <cstdint>
#include <vector>

#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::bench {

inline constexpr int kStepR = 4;
inline constexpr int kStepT = 256;
inline constexpr int kStepQuery = kStepT / kStepR;  // every request 64 tokens: a chunk of 4 requests fills T
inline constexpr int kStepPrefix = 2048;
inline constexpr int kStepMaxChunks = 16;

/// The config of the step benchmarks: `model` the 8-layer V4 program at R = 4, T = 256, else one
/// C4A layer; caches for kStepMaxChunks chunks of requests that each own their blocks.
[[nodiscard]] model::PipelineConfig step_config(bool model);

/// A step of `chunks` x 4 requests of 64 new tokens after 2048, each owning its blocks.
struct BenchStep {
  std::vector<std::vector<std::int32_t>> swa, comp;
  std::vector<graphs::RequestInput> requests;
};

/// Fills `out` (empty) with a step of `chunks` chunks for `config`, the last of `last_requests`
/// requests (in [1, 4]; below 4 that chunk is not full: 64 x last_requests tokens).
void make_step(const model::PipelineConfig& config, int chunks, BenchStep& out, int last_requests = kStepR);

}  // namespace spg::bench
