// serve_loop's glue: a scheduler chunk's (or step's) model-front arguments, and the end-to-end
// verifier that checks sampled chunks, or whole steps chunk by chunk, against the CPU references
// (insert included: the caches the device filled are read back and compared byte for byte).
// Its messages name a chunk by the model front's counter ("chunk N": the chunk's global index)
// and a step likewise ("step N [chunk c]": the step's launch index, c its chunk).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/kernels/reference/kv_cache_reference.hpp"
#include "spgraph/kernels/reference/sparse_mla_reference.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "spgraph/scheduler/chunk_plan.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"

namespace spg::samples {

/// @brief The model front's per-layer outputs (the executor's typed views), resolved once at set-up.
kernels::SyntheticFrontArgs front_layers(const graphs::Executor& ex);

/// @brief The model front's arguments for one chunk: `layers` (from front_layers) plus the
///        chunk's lengths (step: the front's counter). No lookups: called every step.
kernels::SyntheticFrontArgs make_front_args(const kernels::SyntheticFrontArgs& layers,
                                            std::span<const std::int32_t> query_start_loc,
                                            std::span<const std::int32_t> seq_lens,
                                            const int (&new_compressed_rows)[graphs::kNumRatios], std::uint64_t seed,
                                            std::uint64_t step);
/// @brief The same for a scheduler chunk (step = the chunk's global index).
kernels::SyntheticFrontArgs make_front_args(const kernels::SyntheticFrontArgs& layers,
                                            const scheduler::ChunkPlan& plan, std::uint64_t seed, std::uint64_t step);

/// @brief One model front for a whole step run by run(StepInput): the step's rows (every chunk's
///        tokens and completed compressed rows, in order), with top-k indices valid for its
///        shortest sequence (every chunk's requests are at least that long).
kernels::SyntheticFrontArgs make_step_front_args(const kernels::SyntheticFrontArgs& layers,
                                                 const scheduler::StepPlan& plan, std::uint64_t seed,
                                                 std::uint64_t step);

/// @brief Checks sampled chunks end to end: before() snapshots the cache blocks the chunk touches,
///        after() checks the inserted bytes and the sampled tokens' outputs. A whole step run by
///        run(StepInput) is checked the same way, chunk by chunk in the step's order, each chunk on
///        its rows of the step's buffers (docs/graphs.md, "Steps"): the CPU inserts of chunks
///        0 .. c are applied before chunk c's reference, and the caches compared once, after the
///        step.
class Verifier {
 public:
  Verifier(graphs::Executor& ex, std::uint64_t seed);
  void before(const scheduler::ChunkPlan& chunk);
  void after(const scheduler::ChunkPlan& chunk, int bucket, std::uint64_t front_step);
  /// A step run whole (the executor needs step options): its model front is make_step_front_args'
  /// with counter `front_step`. Counts one pass or failure for the whole step.
  void before(const scheduler::StepPlan& step);
  void after(const scheduler::StepPlan& step, std::uint64_t front_step);
  /// Chunks (or, for steps, steps) that passed / failed.
  [[nodiscard]] int passed() const noexcept { return passed_; }
  [[nodiscard]] int failed() const noexcept { return failed_; }
  /// Chunks checked, those of steps included.
  [[nodiscard]] int chunks_checked() const noexcept { return chunks_checked_; }

 private:
  struct Snapshot {
    std::vector<std::int32_t> blocks;       // physical ids, in compact order
    std::vector<std::uint8_t> bytes;        // compact cache: blocks.size() x stride
  };
  /// Where a chunk's front values and outputs sit: rows from 0 for a chunk run alone, its rows of
  /// the step for a step's chunk (top-k then drawn for the step's shortest sequence).
  struct Placement {
    std::uint64_t front_step{0};
    int step_chunk{-1};  // -1: a chunk run alone; -2: a whole step; else its index in the step
    graphs::ChunkRows rows{};
    int topk_seq_len{0};  // > 0: every token's top-k rows drawn for this seq_len (make_step_front_args)
  };
  Snapshot snapshot(std::size_t layer, bool compressed, const std::vector<std::int32_t>& blocks) const;
  void snapshot_all(const std::vector<const scheduler::ChunkPlan*>& chunks);
  /// The chunk's sampled tokens (draws from rng_).
  std::vector<int> sample_tokens(int num_tokens);
  /// Applies the CPU insert of the chunk's rows of layer `l` to `state` (the expected cache);
  /// clears `ok` on a reference fault. Returns the compact layout of `state`.
  kernels::CacheLayout insert_reference(std::size_t l, Snapshot& state, bool compressed,
                                        const scheduler::ChunkCachePlan& cache, const Placement& at, bool& ok) const;
  /// The device's cache of layer `l` against the expected `state`.
  bool cache_matches(std::size_t l, const Snapshot& state, bool compressed, const Placement& at) const;
  /// The device's outputs of layer `l` at `tokens` against the reference's `want`.
  bool outputs_match(std::size_t l, const std::vector<int>& tokens, const kernels::reference::SparseMlaReferenceOutputs& want,
                     const kernels::reference::FaultLog& log, const Placement& at) const;
  /// Insert (into the expected caches), then gather, combine and attention of layer `l` on the
  /// sampled tokens, against the device's outputs.
  bool verify_layer(const scheduler::ChunkPlan& plan, std::size_t l, int bucket, const std::vector<int>& tokens,
                    const Placement& at);
  /// Whether the executor's split of `step` is the scheduler's chunks (else the rows would not map).
  bool split_matches(const scheduler::StepPlan& step, std::uint64_t front_step);

  graphs::Executor& ex_;
  std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<Snapshot> swa_before_;
  std::vector<Snapshot> comp_before_;
  std::optional<graphs::StepSplitter> splitter_;  // executors with step options
  int passed_{0};
  int failed_{0};
  int chunks_checked_{0};
};

}  // namespace spg::samples
