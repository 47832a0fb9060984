// Step loop: the small kernels that let one graph launch run a whole step of chunks
// (docs/graphs.md, "Steps"). The step graph is
//
//   head -> WHILE(fast_loop) { next_fast -> the largest bucket's layers }
//        -> WHILE(loop) { next -> SWITCH(select) { bucket b: the layers' stages at bucket b } } -> tail
//
// head folds the previous step's fault counters, copies the step header (chunk count, the count of
// leading chunks the host put on the largest bucket, each chunk's bucket) into the device step
// state and every chunk's metadata block from the pinned staging block into the device step blocks
// (the only reads of pinned memory in a step; a staged step run again has none, its state and
// blocks are still on the device), and opens the first loop when there is a leading
// chunk, the second when there are more. next_fast, once per leading chunk, and next, once per
// chunk after them, copy that chunk's block from the device step blocks to the device metadata
// block the layers read and advance the state; next also selects the chunk's bucket body. So a
// leading chunk costs one small kernel and a WHILE iteration before its stages, a later one the
// SWITCH too (about 5 us of GPU time a chunk, docs/benchmarks.md). tail releases the staging block
// to the host once the whole step has run. Launched outside a graph (the eager step), head and
// next set no conditional: the host loops and picks the body.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "spgraph/kernels/stage_in/stage_in.hpp"
#include "spgraph/kernels/step_status.hpp"

namespace spg::kernels {

/// @brief The device step state (int32 words): [count, next, current, arrived, fast, buckets[max_chunks]].
struct StepStateWords {
  static constexpr int count = 0;    ///< chunks in this step
  static constexpr int next = 1;     ///< index of the chunk the next loop iteration runs
  static constexpr int current = 2;  ///< index of the chunk this iteration runs
  static constexpr int arrived = 3;  ///< next's CTAs done with this iteration's copy (0 between kernels)
  /// Chunks 0 .. fast - 1 run in the first loop, on the largest bucket's body (buckets[c] is that
  /// bucket for each); the rest in the second.
  static constexpr int fast = 4;
  static constexpr int buckets = 5;  ///< [max_chunks]: chunk c's bucket index
  /// Words of the header for `max_chunks` chunks (a multiple of 4: what follows stays 16-byte aligned).
  [[nodiscard]] static constexpr int header_words(int max_chunks) noexcept { return (buckets + max_chunks + 3) / 4 * 4; }
};

/// @brief Where the loop's kernels read and write; fixed for the life of the executor.
struct StepLoopArgs {
  /// The step staging block: header, then the chunks' metadata blocks. Null: the step a launch
  /// before loaded into `state` and `step_meta` runs again (a staged step, Executor::run_staged);
  /// head then only resets the loop's position, and there is no block to release.
  const std::int32_t* staging{nullptr};
  std::int32_t* state{nullptr};          ///< device step state (header_words(max_chunks) words)
  int max_chunks{0};
  std::size_t chunk_bytes{0};            ///< one chunk's metadata block (a multiple of 16)
  int header_words{0};                   ///< StepStateWords::header_words(max_chunks)
  void* step_meta{nullptr};              ///< device step blocks: max_chunks blocks of chunk_bytes
  void* chunk_meta{nullptr};             ///< the device metadata block the layers read
  StatusBlock* status{nullptr};
  /// The staging block's release to the host, by tail after the whole step (all null: no release).
  /// After the step rather than after its last read: relaunching a step graph whose previous
  /// launch still runs cost the host more (docs/benchmark_history.md, "The host cost of a launch").
  StagingRelease release{};
};

/// @brief The loops' conditionals, and whether the kernels set them (only inside the step graph).
struct StepConditionals {
  cudaGraphConditionalHandle fast_loop{0};  ///< the first loop's (the leading chunks on the largest bucket)
  cudaGraphConditionalHandle loop{0};
  cudaGraphConditionalHandle select{0};
  bool set{false};
};

struct StepLoop {
  /// @throws InvalidArgument for a null or misaligned pointer, max_chunks < 0 or a chunk size not
  ///         a positive multiple of 16.
  static void can_implement(const StepLoopArgs& a);
  /// head: fault fold, header copy, every chunk's block from staging to step_meta, fast_loop
  /// opened when fast > 0 and loop when count > fast. A grid sized for max_chunks blocks; CTAs
  /// past the step's blocks copy nothing. Without a staging block: the fold, the loop's position
  /// reset and the conditionals from the state already there, in one CTA.
  static cudaError_t run_head(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept;
  /// next: current = next++, step block `current` to chunk_meta, select = buckets[current],
  /// loop = next < count. A few CTAs; the last to finish its part of the copy advances the state.
  static cudaError_t run_next(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept;
  /// next_fast: the same copy and advance for the first loop, fast_loop = next < fast (no select).
  static cudaError_t run_next_fast(const StepLoopArgs& a, const StepConditionals& c, cudaStream_t stream) noexcept;
  /// tail: the staging block's release (StagingRelease) after the loop. One thread.
  static cudaError_t run_tail(const StepLoopArgs& a, cudaStream_t stream) noexcept;
};

}  // namespace spg::kernels
