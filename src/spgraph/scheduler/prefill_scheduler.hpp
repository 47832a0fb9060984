// PrefillScheduler: chunked prefill over a stream of requests, with paged cache blocks.
//
// Each schedule() call forms one step: a FIFO walk over the requests that gives each as many
// tokens as the step's budget (and an optional per-request cap) allows, cut into chunks of at most
// R requests and T tokens by the split rule of src/spgraph/graphs/chunk_split.hpp (the executor's run(step)
// cuts by the same rule). A step holds one or more chunks; a request's tokens in a step are
// contiguous and may continue from one chunk into the next, so the executor must run a step's
// chunks in order (the insert stage of a chunk writes the rows the next one reads).
//
// Blocks: a request is admitted only when every cache kind can hold its whole prompt beyond what
// running requests are already promised; blocks are then handed out as it grows, all kinds at once
// for its tokens of the step. So a running request never waits and never deadlocks, and a request
// that does not fit waits at the head of the queue (strict FIFO: nothing overtakes it) until
// finished requests return their blocks. Formulas: docs/pipeline.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "spgraph/graphs/chunk_split.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "spgraph/scheduler/block_allocator.hpp"
#include "spgraph/scheduler/cache_kind.hpp"
#include "spgraph/scheduler/chunk_plan.hpp"
#include "spgraph/scheduler/request.hpp"

namespace spg::scheduler {

namespace detail {
/// What the scheduler keeps per admitted request: progress and the blocks it holds per cache kind.
struct RequestState {
  Request request;
  int prefilled{0};                               // tokens prefilled so far (the prefix)
  std::vector<std::vector<std::int32_t>> blocks;  // per cache kind: the block table, covers `prefilled`
  std::vector<int> footprint;                     // per cache kind: blocks of the whole prompt
};
}  // namespace detail

/// @brief Step-level limits; the chunk limits R and T come from the PipelineConfig.
struct SchedulerConfig {
  int max_num_batched_tokens{8192};  ///< token budget of one step, over all its chunks
  int max_tokens_per_request{0};     ///< cap on one request's tokens per step; 0: only the budget
  int max_chunks_per_step{0};        ///< 0: as many chunks as the budget fills

  /// @throws InvalidArgument naming the first field out of bounds, with its value and bounds.
  void validate() const;
  /// "budget 8192 tokens/step, ..." for logs and reports.
  [[nodiscard]] std::string describe() const;
};

/// @brief One step: its chunks, in the order they must run.
struct StepPlan {
  std::int64_t step{0};
  std::vector<ChunkPlan> chunks;
  std::vector<std::int64_t> started;   ///< requests that got their first tokens in this step
  std::vector<std::int64_t> finished;  ///< requests prefilled to the end in this step

  [[nodiscard]] int num_tokens() const noexcept;
  /// The step as the executor's run(StepInput) input: one entry per request, its pieces merged
  /// (query_len their sum, seq_len and block tables the last piece's). Spans into this plan, valid
  /// while it lives, until the next input() call. run(StepInput) splits it by the same rule back
  /// into these chunks; the insert slots are left to the device.
  [[nodiscard]] const graphs::StepInput& input() const;

 private:
  mutable std::vector<graphs::RequestInput> request_inputs_;
  mutable graphs::StepInput input_;
};

/// @brief Engine-style chunked prefill scheduler with one paged block allocator per cache kind.
class PrefillScheduler {
 public:
  /// Takes R = pipeline.max_requests, T = pipeline.max_tokens, max_model_len, the cache kinds and
  /// W from the pipeline (PipelineConfig::window(): one window per program).
  /// @throws InvalidArgument naming the field when the pipeline or scheduler config is invalid
  ///         (PipelineConfig::validate), or a cache kind's pool cannot hold one request of
  ///         max_model_len tokens.
  PrefillScheduler(const model::PipelineConfig& pipeline, const SchedulerConfig& config);

  /// Queues a request; it may be scheduled from its arrival step on.
  /// @throws InvalidArgument naming the request when prompt_len is outside [1, max_model_len],
  ///         arrival_step is before next_step(), or its id is already queued or running.
  void submit(const Request& request);
  /// submit() for each request; stops at the first that throws.
  void submit(std::span<const Request> requests);

  /// Forms step next_step() and advances it. Blocks of the requests finished in the previous step
  /// are released first, so a step's plans stay valid until the next call. A step with nothing to
  /// run has no chunks.
  /// @throws StateError if its own block accounting is broken (a bug, never expected).
  [[nodiscard]] StepPlan schedule();

  /// Nothing queued or running (blocks of the last finished requests return at the next schedule()).
  [[nodiscard]] bool done() const noexcept { return pending_.empty() && running_.empty(); }
  [[nodiscard]] std::int64_t next_step() const noexcept { return next_step_; }
  /// Submitted and not started, including those that have not arrived yet.
  [[nodiscard]] std::size_t num_waiting() const noexcept { return pending_.size(); }
  /// Started and not finished.
  [[nodiscard]] std::size_t num_running() const noexcept { return running_.size(); }

  [[nodiscard]] const std::vector<CacheKind>& cache_kinds() const noexcept { return kinds_; }
  /// The allocator of cache kind `kind` (an index into cache_kinds()).
  /// @throws InvalidArgument for an index out of range.
  [[nodiscard]] const BlockAllocator& allocator(std::size_t kind) const;
  /// Blocks of kind `kind` that running requests will still take (admission keeps
  /// in_use + promised <= total).
  [[nodiscard]] int promised_blocks(std::size_t kind) const;

  [[nodiscard]] int max_requests() const noexcept { return max_requests_; }
  [[nodiscard]] int max_tokens() const noexcept { return max_tokens_; }
  [[nodiscard]] int max_model_len() const noexcept { return max_model_len_; }
  [[nodiscard]] int window() const noexcept { return window_; }
  [[nodiscard]] const SchedulerConfig& config() const noexcept { return config_; }

 private:
  [[nodiscard]] bool has_room(const StepPlan& plan, int budget_left) const noexcept;
  [[nodiscard]] graphs::SplitCursor cursor(const StepPlan& plan) const noexcept;
  [[nodiscard]] bool fits(const detail::RequestState& state) const noexcept;
  [[nodiscard]] ChunkPlan empty_chunk() const;
  // Gives `state` its tokens of this step; returns how many.
  int serve(detail::RequestState& state, StepPlan& plan, int budget_left);
  void append_piece(ChunkPlan& chunk, const detail::RequestState& state, int query_len) const;

  std::vector<CacheKind> kinds_;
  SchedulerConfig config_;
  int max_requests_;
  int max_tokens_;
  int max_model_len_;
  int window_;
  graphs::ChunkLimits limits_;  // R, T and max_chunks_per_step: the split rule's limits

  std::vector<BlockAllocator> allocators_;
  std::vector<int> promised_;  // per kind: blocks running requests will still take

  std::deque<Request> pending_;                 // by arrival step, then submission order
  std::vector<detail::RequestState> running_;   // in admission (so arrival) order
  std::vector<detail::RequestState> retired_;   // finished last step: blocks return next schedule()
  std::unordered_set<std::int64_t> live_ids_;   // pending and running
  std::vector<graphs::ChunkPiece> pieces_;      // scratch of serve()
  std::int64_t next_step_{0};
};

}  // namespace spg::scheduler
