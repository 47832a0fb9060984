// Steps: every request of a prefill step in one graph launch (docs/graphs.md, "Steps").
//
// The host splits the step into chunks of at most R requests and T tokens by the scheduler's rule
// (src/spgraph/graphs/chunk_split.hpp), checks every chunk and writes the step header (chunk count, each
// chunk's bucket) and every chunk's metadata block into one pinned staging block. One launch of
// the step graph then loops over the chunks on the device: a WHILE conditional node whose body
// stages the next chunk and picks its bucket body with a SWITCH conditional node
// (src/spgraph/kernels/step_loop). Each chunk runs at its own bucket's size, on its own rows of
// the step's buffers (ChunkScalars::token_offset, new_row_offset).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "spgraph/graphs/buckets.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/chunk_split.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/graphs/run_status.hpp"
#include "spgraph/kernels/step_loop/step_loop.hpp"
#include "spgraph/memory/pool_plan.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

class Pipeline;  // src/spgraph/graphs/pipeline.hpp (internal): a (program, bucket) recording

/// @brief Every request of one step. A request's query_len is its tokens in this step (>= 1) and
///        its seq_len the tokens so far with them; its block tables cover seq_len. A step carries
///        no slot lists: the device derives the insert slots from the block tables.
struct StepInput {
  std::span<const RequestInput> requests;
};

/// Upper bounds of the step options (ExecutorOptions::max_step_requests / max_step_tokens).
inline constexpr int kMaxStepRequests = 4096;
inline constexpr int kMaxStepTokens = 1 << 20;

/// @brief The step staging block (int32 words): the header (kernels::StepStateWords: chunk count,
///        then each chunk's bucket), then max_chunks chunk metadata blocks of chunk_words each.
struct StepLayout {
  int max_requests{0};  ///< max_step_requests
  int max_tokens{0};    ///< max_step_tokens
  int max_chunks{0};    ///< max_split_chunks(max_requests, max_tokens, T)
  int header_words{0};
  int chunk_words{0};   ///< ChunkMetaLayout::words
  [[nodiscard]] std::size_t words() const noexcept {
    return static_cast<std::size_t>(header_words) + static_cast<std::size_t>(max_chunks) * static_cast<std::size_t>(chunk_words);
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return words() * 4; }
  /// Bytes of the device step blocks (pool slot step_meta): max_chunks blocks of chunk_words.
  [[nodiscard]] std::size_t meta_bytes() const noexcept {
    return static_cast<std::size_t>(max_chunks) * static_cast<std::size_t>(chunk_words) * 4;
  }
  [[nodiscard]] std::size_t chunk_offset(int c) const noexcept {
    return static_cast<std::size_t>(header_words) + static_cast<std::size_t>(c) * static_cast<std::size_t>(chunk_words);
  }
  /// The layout for `config` (validated by the caller) and the step options.
  /// @throws InvalidArgument naming max_step_requests / max_step_tokens when outside
  ///         [1, kMaxStepRequests] / [1, kMaxStepTokens].
  [[nodiscard]] static StepLayout make(const model::PipelineConfig& config, int max_step_requests,
                                       int max_step_tokens);
};

/// Adds the step slots to a pool plan (docs/memory.md): the two pinned step staging blocks, the
/// device step state and the device step blocks. Nothing for a layout without chunks (no steps).
void plan_step_slots(memory::PoolPlan& plan, const StepLayout& layout);

/// @brief What a split found: the chunk count, or why the step is refused (nothing is written).
struct StepSplit {
  RunStatus status{RunStatus::ok};  ///< ok, no_bucket (more than the step maxima) or bad_chunk
  int chunks{0};
  int bad_request{-1};              ///< the step's request at fault (-1: the whole step)
  const char* bad_field{nullptr};
  const char* bad_reason{nullptr};
};

/// @brief The host's split of a step into chunk inputs, into scratch sized once (no allocation).
class StepSplitter {
 public:
  StepSplitter(const model::PipelineConfig& config, const StepLayout& layout);
  /// Splits `step` by the split rule: each piece is its request with query_len the piece's tokens
  /// and seq_len the tokens up to the piece's end. Refuses a step over the maxima (no_bucket,
  /// field "step.requests" / "step.tokens"), a request with query_len < 1 or seq_len < query_len
  /// (bad_chunk). Valid until the next split().
  [[nodiscard]] StepSplit split(const StepInput& step) noexcept;
  /// Chunk c of the last split, as the executor's chunk input.
  [[nodiscard]] ChunkInput chunk(int c) const noexcept;
  /// The step's request index of piece b of chunk c.
  [[nodiscard]] int request_of(int c, int b) const noexcept {
    return piece_request_[static_cast<std::size_t>(chunk_begin_[static_cast<std::size_t>(c)] + b)];
  }

 private:
  ChunkLimits limits_;
  StepLayout layout_;
  std::vector<RequestInput> pieces_;
  std::vector<int> piece_request_;
  std::vector<int> chunk_begin_;
};

/// @brief What checking a step found: its chunk count, or why it is refused. A refused chunk is
///        named by its index and the request at fault by the step's numbering (-1: the whole step
///        or a chunk-wide field), as run(StepInput) reports them.
struct StepCheck {
  RunStatus status{RunStatus::ok};  ///< ok, no_bucket or bad_chunk
  int chunks{0};
  int bad_chunk{-1};                ///< the chunk at fault (-1: the split refused the step)
  int bad_request{-1};
  const char* bad_field{nullptr};
  const char* bad_reason{nullptr};
};

/// @brief The host side of run(StepInput) up to its launch: check() splits the step, checks every
///        chunk and finds its bucket; write() then fills a step staging block. No allocation (the
///        scratch is sized at construction), no exception; not for use by two threads at once.
///        Holds `buckets` and `encoder` by reference: both must outlive it.
///
/// In the header write() puts the leading chunks whose bucket has the largest T (full chunks,
/// whatever their request count) on the largest bucket, fast_bucket(): the step graph runs them
/// in a loop without the SWITCH (build_step_graph). The body of a larger bucket writes what the
/// chunk's own would (the kernels read every length from the metadata; the bucket sizes only
/// their grids).
class StepStager {
 public:
  StepStager(const model::PipelineConfig& config, const StepLayout& layout, const BucketSet& buckets,
             ChunkEncoder& encoder);
  /// Splits and checks `step` for a program of `ratio_mask` (ChunkEncoder::check). Nothing is
  /// written anywhere but the stager's scratch.
  [[nodiscard]] StepCheck check(const StepInput& step, int ratio_mask) noexcept;
  /// Writes the step the last check() accepted into `block` (StepLayout::words() words): the
  /// header (chunk count, leading chunks on fast_bucket(), each chunk's bucket), then each chunk's
  /// metadata on its rows of the step.
  void write(int ratio_mask, std::int32_t* block) const noexcept;
  /// The largest bucket, which the leading full chunks of a step run on.
  [[nodiscard]] int fast_bucket() const noexcept { return bucket_set_.size() - 1; }
  /// The buckets of the last accepted step's chunks, in order: each chunk's own (the header
  /// write() fills names the bodies the step runs, fast_bucket() for the leading full ones).
  [[nodiscard]] std::span<const int> buckets() const noexcept {
    return {buckets_.data(), static_cast<std::size_t>(chunks_)};
  }
  [[nodiscard]] const StepSplitter& splitter() const noexcept { return splitter_; }
  /// Chunk c's checks from the last accepted step (c < its chunk count).
  [[nodiscard]] const ChunkCheck& chunk_check(int c) const noexcept { return checks_[static_cast<std::size_t>(c)]; }

 private:
  StepLayout layout_;
  const BucketSet& bucket_set_;
  ChunkEncoder& encoder_;
  StepSplitter splitter_;
  std::vector<ChunkCheck> checks_;
  std::vector<int> buckets_;
  int chunks_{0};
};

/// @brief A captured step graph and its bodies (owned by the graph), for inspection and counting.
struct StepGraph {
  Graph graph;
  cudaGraph_t fast_loop_body{nullptr};  ///< next_fast, then the largest bucket's layers
  cudaGraph_t loop_body{nullptr};       ///< next, then the SWITCH
  std::vector<cudaGraph_t> bucket_bodies;
  /// Nodes at every level: the top graph's (head, the two WHILEs, tail), the first loop body's
  /// (next_fast and the largest bucket's layers), the second's (next, SWITCH) and every bucket
  /// body's. @throws CudaError.
  [[nodiscard]] std::size_t node_count() const;
  /// What node_count() must be for these bucket bodies: 7 + the sum of their layers' kernel
  /// launches (Pipeline::kernel_launches() less its stage-in: next has staged the chunk), the
  /// last (largest) body's twice.
  [[nodiscard]] static std::size_t expected_nodes(std::span<const Pipeline* const> bodies) noexcept;
};

/// Builds the step graph: head -> WHILE { next_fast -> the largest bucket's layers } -> WHILE {
/// next -> SWITCH { one body per bucket } } -> tail, the bodies recorded by stream capture into
/// the conditional nodes' graphs on `stream` (which must not be capturing); `bodies` in bucket
/// order, the last the largest (StepStager::fast_bucket()). @throws CudaError; InvalidArgument from
/// StepLoop::can_implement.
[[nodiscard]] StepGraph build_step_graph(const kernels::StepLoopArgs& args, std::span<const Pipeline* const> bodies,
                                         cudaStream_t stream);

/// Builds the flat step graph of a step of `chunks` chunks that all run `largest` (the largest
/// bucket's body): head -> chunks x [next -> its layers] -> tail as one plain graph, by stream
/// capture on `stream` (which must not be capturing). The kernels and their order are the step
/// graph's for such a step (its first loop), without the conditional nodes: for an all-full step
/// (StepStager::write puts every chunk on the largest bucket). @throws CudaError;
/// InvalidArgument from StepLoop::can_implement, or `chunks` outside [1, args.max_chunks].
[[nodiscard]] Graph build_flat_step_graph(const kernels::StepLoopArgs& args, const Pipeline& largest, int chunks,
                                          cudaStream_t stream);
/// What a flat step graph's node count must be: head and tail, and per chunk next and `largest`'s
/// layers (its kernel launches less the chunk graph's stage-in).
[[nodiscard]] std::size_t flat_step_nodes(const Pipeline& largest, int chunks) noexcept;

/// The same step launched from a host loop (the eager step): head, then per chunk next and the
/// chunk's bucket body, then tail. `chunk_buckets`: the buckets the host staged.
[[nodiscard]] cudaError_t record_step_eager(const kernels::StepLoopArgs& args, std::span<const Pipeline* const> bodies,
                                            std::span<const int> chunk_buckets, cudaStream_t stream) noexcept;

}  // namespace spg::graphs
