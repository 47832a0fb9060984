// serve_loop's glue: a scheduler chunk's model-front arguments, and the
// end-to-end verifier that checks sampled chunks against the CPU references (insert included:
// the caches the device filled are read back and compared byte for byte).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "spgraph/graphs/executor.hpp"
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
///        after() checks the inserted bytes and the sampled tokens' outputs.
class Verifier {
 public:
  Verifier(graphs::Executor& ex, std::uint64_t seed);
  void before(const scheduler::ChunkPlan& chunk);
  void after(const scheduler::ChunkPlan& chunk, int bucket, std::uint64_t front_step);
  [[nodiscard]] int passed() const noexcept { return passed_; }
  [[nodiscard]] int failed() const noexcept { return failed_; }

 private:
  struct Snapshot {
    std::vector<std::int32_t> blocks;       // physical ids, in compact order
    std::vector<std::uint8_t> bytes;        // compact cache: blocks.size() x stride
  };
  Snapshot snapshot(std::size_t layer, bool compressed, const std::vector<std::int32_t>& blocks) const;
  /// The chunk's sampled tokens (draws from rng_).
  std::vector<int> sample_tokens(int num_tokens);
  /// Checks layer `l`'s cache after the insert stage against `before` plus the CPU insert (which
  /// `before` then holds); clears `ok` on a mismatch. Returns the compact layout of `before`.
  kernels::CacheLayout check_insert(std::size_t l, Snapshot& before, bool compressed,
                                    const scheduler::ChunkCachePlan& cache, std::uint64_t step, bool& ok) const;
  /// The device's outputs of layer `l` at `tokens` against the reference's `want`.
  bool outputs_match(std::size_t l, const std::vector<int>& tokens, const kernels::reference::SparseMlaReferenceOutputs& want,
                     const kernels::reference::FaultLog& log, std::uint64_t step) const;
  /// Insert, then gather, combine and attention of layer `l` on the sampled tokens.
  bool verify_layer(const scheduler::ChunkPlan& plan, std::size_t l, int bucket, const std::vector<int>& tokens,
                    std::uint64_t step);

  graphs::Executor& ex_;
  std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<Snapshot> swa_before_;
  std::vector<Snapshot> comp_before_;
  int passed_{0};
  int failed_{0};
};

}  // namespace spg::samples
