// Executor: plans and allocates the pool for what the caller did not bind, captures one CUDA
// graph per (program, chunk shape, staging block), and replays them on the caller's stream: one
// graph launch per step, no allocation (docs/graphs.md).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/buckets.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/run_status.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/kernels/step_status.hpp"
#include "spgraph/memory/buffer_pool.hpp"
#include "spgraph/model/pipeline_config.hpp"

namespace spg::graphs {

// The recording of one (program, bucket) and the pointers it is recorded over: internal
// (src/spgraph/graphs/pipeline.hpp, not installed); the executor holds its recordings through pointers.
class Pipeline;
struct PipelineBuffers;

/// @brief How an executor is set up.
struct ExecutorOptions {
  std::vector<int> r_buckets;               ///< empty: BucketSet::make_default
  std::vector<int> t_buckets;               ///< empty: BucketSet::make_default
  std::vector<std::vector<int>> programs;   ///< layer lists; empty: one program of every layer
  bool insert{true};                        ///< record the insert stage (quantize new K rows into the caches)
  bool capture{true};                       ///< false: eager only (debugging); run() then fails
  /// Time the host phases of every run() into RunResult::phases (three clock reads a step).
  bool time_host_phases{false};
  /// The caller's buffers, one LayerBuffers per layer (or none): a member with data is used in
  /// place, the rest is planned in the pool (docs/memory.md, "Engine-owned buffers").
  std::vector<LayerBuffers> buffers;
  /// Steps (run(StepInput), docs/graphs.md "Steps"): the most requests and tokens one step may
  /// hold. Both 0: no step graph (run(StepInput) reports not_warmed_up); otherwise both in
  /// [1, kMaxStepRequests] / [1, kMaxStepTokens]. Warm-up then captures one step graph per
  /// program and staging block, holding one body per bucket.
  int max_step_requests{0};
  int max_step_tokens{0};
  /// Steps of 2 .. flat_step_chunks chunks that are all full (every chunk's bucket has the
  /// largest T, so the step graph's first loop would run all of them) launch one plain graph of
  /// that many copies of the largest bucket's body instead (build_flat_step_graph): the same
  /// kernels, no conditional node to launch or to run; a staged step of one chunk (run_staged;
  /// run(StepInput) launches a step of one chunk as a chunk) the plain graph of its chunk's
  /// bucket. 0: none; otherwise steps are on and flat_step_chunks is in [2,
  /// StepLayout::max_chunks]. Warm-up instantiates flat_step_chunks - 1 such graphs per program
  /// and staging block, and one of one chunk per bucket.
  int flat_step_chunks{0};
  /// With flat_step_chunks: steps of 2 .. flat_step_chunks chunks that are not all full launch
  /// their flat graph too, every chunk on the largest bucket's body. Each chunk writes the rows it
  /// writes at its own bucket (the kernels read its lengths from its metadata; the bucket sizes
  /// only the grids), with the values an executor of that one bucket computes: a small chunk's
  /// attention may take another path at its own bucket (the top-k split), whose sums round
  /// otherwise. A chunk that is not full pays on the GPU for the largest bucket's grids beyond
  /// its tokens (docs/graphs.md, "Padded flat steps"); the step saves the step graph's
  /// conditional nodes, on the host at launch and on the GPU. Needs flat_step_chunks != 0.
  bool flat_step_pad{false};
};

/// @brief What an executor is sized from, worked out on the host before any CUDA call: the
///        validated config, the buckets, the layer programs (and the ratios each uses) and the
///        pool plan of what the caller did not bind.
struct ExecutorPlan {
  model::PipelineConfig config;
  BucketSet buckets;
  std::vector<std::vector<int>> programs;
  std::vector<int> program_ratios;  ///< per program: bit ratio_index(r) set for each ratio r its layers use
  memory::PoolPlan pool;  ///< without the attention workspace, which warm-up carves (its size asks the device)
  StepLayout step;        ///< the step staging block; max_chunks == 0 without steps
};

/// @brief The executor's host-side planning, in the order it validates: the config
///        (PipelineConfig::validate), the bucket lists, the programs, the bindings' shapes and
///        overlaps (check_binding_shapes), then the pool plan. Makes no CUDA call, so a config
///        error never waits behind a device query or an allocation (planning tools and fuzzers
///        call it without a GPU).
/// @throws InvalidArgument naming the first field at fault.
[[nodiscard]] ExecutorPlan plan_executor(model::PipelineConfig config, const ExecutorOptions& options);

/// @brief Every layer's buffers and the step's shared workspaces as typed views.
struct ExecutorViews {
  std::vector<LayerBuffers> layers;
  StepWorkspace workspace;
};

/// @brief The views an executor hands out: the caller's buffer where `options` binds one, else
///        the pool's slot for it. Host only (the pool may be host-backed: planning tools, fuzzers).
/// @throws InvalidArgument / CapacityError when the pool lacks a slot or a slot is too small.
[[nodiscard]] ExecutorViews executor_views(const model::PipelineConfig& config, const ExecutorOptions& options,
                                           const memory::BufferPool& pool);

/// @brief What warm-up did and what it holds (table D of docs/benchmarks.md).
struct WarmupReport {
  int graphs{0};                     ///< chunk graphs (programs x buckets x 2 staging blocks)
  int step_graphs{0};                ///< step graphs (programs x 2 staging blocks; 0 without steps)
  /// Graphs for steps of one chunk: each bucket body with the chunk staging block's stage-in
  /// (programs x buckets x 2 staging blocks; 0 without steps).
  int one_chunk_step_graphs{0};
  /// Plain graphs for all-full steps of 2 .. flat_step_chunks chunks (programs x 2 staging blocks
  /// x (flat_step_chunks - 1); 0 without them).
  int flat_step_graphs{0};
  /// Graphs of a staged step run again (run_staged after its first launch): per program the step
  /// graph without a staging block, and with flat_step_chunks its flat graphs likewise
  /// (programs x flat_step_chunks; 0 without steps).
  int staged_step_graphs{0};
  /// With flat_step_chunks, plain graphs for staged steps of one chunk, one per bucket (programs x
  /// buckets x 3: both step staging blocks and the reruns; 0 without them).
  int staged_one_chunk_graphs{0};
  int buckets{0};
  int programs{0};
  double eager_ms{0};                ///< one eager run of every bucket
  double capture_ms{0};              ///< capture + instantiate + upload of every graph
  std::int64_t graph_device_bytes{0};///< cudaMemGetInfo delta across capture and instantiation
  std::size_t pool_device_bytes{0};
  std::size_t pool_pinned_bytes{0};
  int pool_allocation_calls{0};
  int kernel_launches_per_step{0};   ///< graph nodes of program 0 at its largest bucket
};

struct RunResult {
  RunStatus status{RunStatus::ok};
  cudaError_t cuda{cudaSuccess};
  /// The bucket the chunk ran at: run(ChunkInput), and run(StepInput) of one chunk (launched as
  /// that chunk); -1 for a step of several chunks or none.
  int bucket{-1};
  /// run(StepInput): the chunks the step was split into; for a refused chunk, which one (the
  /// request at fault is then the step's request index).
  int chunks{0};
  int bad_chunk{-1};
  /// bad_chunk: the request at fault (-1 for a chunk-wide field), the field and what is wrong
  /// with it (static strings).
  int bad_request{-1};
  const char* bad_field{nullptr};
  const char* bad_reason{nullptr};
  /// Microseconds the host spent waiting for the device to release a staging block (0 unless the
  /// host was two steps ahead): time the device owed, not host work.
  double waited_us{0.0};
  /// Host microseconds per phase; filled only with ExecutorOptions::time_host_phases.
  struct Phases {
    double staging_us{0.0};  ///< checking the chunk and filling the staging block (waited_us excluded)
    double launch_us{0.0};   ///< cudaGraphLaunch (or the eager launches)
    /// Events: ordering the launch after the last one when the stream changed, and on a caller's
    /// stream the event recorded after the launch; about 0 on the executor's own stream.
    double record_us{0.0};
  } phases;
  [[nodiscard]] bool ok() const noexcept { return status == RunStatus::ok; }
};

class Executor {
 public:
  /// Validates the config, the options and the bound buffers, then plans the pool for the rest and
  /// allocates it (the only allocations the executor ever makes, with the graphs' own at warm-up).
  /// Nothing is allocated before every check has passed.
  /// @throws InvalidArgument (naming the field, or the layer and buffer), CapacityError, CudaError.
  explicit Executor(model::PipelineConfig config, ExecutorOptions options = {});
  /// Every check the constructor makes before its first CUDA call, in its order (the config, the
  /// buckets, the programs, the bound buffers' shapes and overlaps), without a device: for
  /// bindings (the Python package) and tools that must refuse before touching the GPU. The
  /// constructor still checks device residency, which this cannot.
  /// @throws InvalidArgument as the constructor would.
  static void check_options(const model::PipelineConfig& config, const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Runs every bucket of every program once eagerly, captures them all (largest first),
  /// instantiates and uploads, then seals the pool. @throws on any failure, leaving no capture open.
  WarmupReport warmup();

  /// The replay path: checks the chunk, fills a staging block, launches the chunk's graph on
  /// `stream` (the executor's own stream by default) and returns. Never throws, never allocates,
  /// never waits except when the host is two steps ahead of the device.
  ///
  /// The graph reads q, top-k and the K rows when it runs: the caller's writes of them must be
  /// ordered before it on `stream` (issue them on `stream`, or make `stream` wait on an event).
  /// Steps on different streams are ordered by the executor (each step waits for the one before:
  /// they share the pool's workspace), and the outputs are ready in `stream`'s order. On the
  /// executor's own stream a launch records no event; on a caller's stream one event after the
  /// launch, and the executor never touches that stream again (the caller may destroy it).
  [[nodiscard]] RunResult run(const ChunkInput& chunk, int program = 0) noexcept { return run(chunk, program, stream()); }
  [[nodiscard]] RunResult run(const ChunkInput& chunk, int program, cudaStream_t stream) noexcept;
  /// The same recording launched kernel by kernel, for comparison and debugging.
  [[nodiscard]] RunResult run_eager(const ChunkInput& chunk, int program = 0) noexcept {
    return run_eager(chunk, program, stream());
  }
  [[nodiscard]] RunResult run_eager(const ChunkInput& chunk, int program, cudaStream_t stream) noexcept;

  /// A whole step in one graph launch (docs/graphs.md, "Steps"): splits `step` into chunks by the
  /// scheduler's rule, checks them all, writes every chunk's metadata into one staging block and
  /// launches the program's step graph once; the device loops over the chunks, each at its own
  /// bucket. A step of no requests launches and runs no chunk. Refused (nothing written): a step
  /// over max_step_requests / max_step_tokens (no_bucket), a bad request or chunk (bad_chunk,
  /// with bad_chunk and bad_request the step's indices). Never throws, never allocates.
  ///
  /// The layer buffers hold a whole step (required_rows with the step options): the step's tokens
  /// are rows [0, its tokens), request after request, and chunk c reads its q, top-k and K rows
  /// and writes its outputs at rows [offset_c, offset_c + its tokens), offset_c the tokens of the
  /// chunks before it (compressed K rows likewise, the rows each chunk completes after the earlier
  /// chunks'). Rows past the step's tokens are not touched. The chunks run in order; each leaves
  /// what run(chunk) leaves for the same chunk on rows from 0.
  [[nodiscard]] RunResult run(const StepInput& step, int program = 0) noexcept { return run(step, program, stream()); }
  [[nodiscard]] RunResult run(const StepInput& step, int program, cudaStream_t stream) noexcept;
  /// The same step launched from a host loop (head, then per chunk its kernels), for comparison;
  /// works with capture off too.
  [[nodiscard]] RunResult run_eager(const StepInput& step, int program = 0) noexcept {
    return run_eager(step, program, stream());
  }
  [[nodiscard]] RunResult run_eager(const StepInput& step, int program, cudaStream_t stream) noexcept;
  /// Stages a step once for every program (docs/graphs.md, "Staged steps"): the split, the checks
  /// and the staging block of run(StepInput), with every program's compression ratios, and no
  /// launch. Then run_staged(program) launches it per layer program (an engine's per-layer call)
  /// with no host work but the launch: the first run copies the block to the device, the later
  /// ones run what is already there. Refused as run(StepInput) refuses (result.chunks,
  /// bad_chunk, ...; nothing written, and a step staged before stays staged); result.chunks is the
  /// step's chunk count. Never throws, never allocates; waits only as a launch may, for a staging
  /// block the device still reads.
  [[nodiscard]] RunResult stage(const StepInput& step) noexcept;
  /// Launches the staged step for `program` on `stream`, writing what run(StepInput) would have:
  /// every step through the step graph or, all full within flat_step_chunks (with flat_step_pad
  /// any within it), the flat graph; a step of one chunk, which run(StepInput) launches as a
  /// chunk, through the step graph or, with flat_step_chunks, the plain graph of its bucket (the
  /// same body). Refused with not_staged when no step is staged: stage() accepted none yet, or a
  /// run(StepInput) / run_eager(StepInput) the executor accepted has since replaced it (it loads
  /// the device step state). Never throws, never allocates, never waits.
  [[nodiscard]] RunResult run_staged(int program = 0) noexcept { return run_staged(program, stream()); }
  [[nodiscard]] RunResult run_staged(int program, cudaStream_t stream) noexcept;
  /// The same launched from a host loop; works with capture off too.
  [[nodiscard]] RunResult run_staged_eager(int program = 0) noexcept { return run_staged_eager(program, stream()); }
  [[nodiscard]] RunResult run_staged_eager(int program, cudaStream_t stream) noexcept;
  /// Chunks of the staged step (-1: none staged).
  [[nodiscard]] int staged_chunks() const noexcept {
    return staged_.valid ? step_staging_[staged_.block][kernels::StepStateWords::count] : -1;
  }
  /// Records program `program`'s step graph for staging block `staging` (0, 1; -1: the graph of a
  /// staged step run again, with no block), as warm-up built it: for counting its nodes.
  /// @throws StateError before warm-up or without steps; InvalidArgument for `staging` outside
  /// [-1, 1]; CudaError.
  [[nodiscard]] StepGraph record_step_graph(int program, int staging) const;
  /// Records program `program`'s flat step graph of `chunks` all-full chunks for staging block
  /// `staging` (build_flat_step_graph; -1 as above), as warm-up built it with flat_step_chunks >=
  /// chunks. @throws StateError before warm-up or without steps; InvalidArgument for `chunks`
  /// outside [1, max_chunks] or `staging` outside [-1, 1]; CudaError.
  [[nodiscard]] Graph record_flat_step_graph(int program, int chunks, int staging) const;
  [[nodiscard]] const StepLayout& step_layout() const noexcept { return step_layout_; }

  /// Waits for every submitted step (the last launch, which every launch is ordered before, then
  /// the executor's own stream). @throws CudaError.
  void synchronize() const;
  /// Copies the last completed step's fault counters to the host (waits for it first).
  [[nodiscard]] kernels::StepStatus read_status() const;
  /// The fault counters of every step since construction (warm-up's included), the last one's
  /// too: what a serving loop reports and fails on (waits for the submitted steps first).
  /// @throws CudaError.
  [[nodiscard]] kernels::RunFaults read_run_faults() const;

  /// Every buffer of layer `l`, bound or pooled, as typed views (empty where the layer has none).
  [[nodiscard]] const LayerBuffers& layer(std::size_t l) const { return views_.at(l); }
  /// The workspaces the layers of a step share: the gathered kv rows, the combined indices and lengths.
  [[nodiscard]] const StepWorkspace& workspace() const noexcept { return workspace_; }

  [[nodiscard]] const model::PipelineConfig& config() const noexcept { return config_; }
  [[nodiscard]] const BucketSet& buckets() const noexcept { return buckets_; }
  /// The pool: what was planned for the unbound buffers, slot by slot (plan().table()).
  [[nodiscard]] const memory::BufferPool& pool() const noexcept { return pool_; }
  [[nodiscard]] memory::BufferPool& pool() noexcept { return pool_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  [[nodiscard]] int programs() const noexcept { return static_cast<int>(programs_.size()); }
  [[nodiscard]] const std::vector<int>& program_layers(int p) const { return programs_.at(static_cast<std::size_t>(p)); }
  /// The recording behind (program, bucket), after warmup(); for per-stage timing.
  [[nodiscard]] const Pipeline& pipeline(int program, int bucket) const {
    return *entries_.at(static_cast<std::size_t>(program) * static_cast<std::size_t>(buckets_.size()) +
                        static_cast<std::size_t>(bucket)).pipeline;
  }
  /// The bucket body of (program, bucket) in the step graph: the same stages on a step's rows.
  /// After warmup(), with steps.
  [[nodiscard]] const Pipeline& step_body(int program, int bucket) const {
    return *bodies_.at(static_cast<std::size_t>(program)).at(static_cast<std::size_t>(bucket));
  }
  /// Records (program, bucket, staging block) into a new graph, exactly as warm-up captured it:
  /// for inspecting what a replay launches (node counts, kernel arguments). After warmup().
  /// @throws StateError before warm-up; CudaError when the capture fails.
  [[nodiscard]] Graph record_graph(int program, int bucket, int staging) const;
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }
  /// Steps launched as a flat step graph (ExecutorOptions::flat_step_chunks, flat_step_pad), a
  /// staged step of one chunk through its bucket's plain graph included.
  [[nodiscard]] std::uint64_t flat_steps() const noexcept { return flat_steps_; }
  /// Launches of a staged step that ran what an earlier launch had loaded (no staging block read).
  [[nodiscard]] std::uint64_t staged_reruns() const noexcept { return staged_reruns_; }
  [[nodiscard]] std::uint64_t host_waits() const noexcept { return host_waits_; }

 private:
  // From plan_executor(config, options) with the same options. A reference, so that the public
  // constructor's plan_executor(config, options) reads the options before they are moved from.
  Executor(ExecutorPlan plan, ExecutorOptions&& options);
  // The record_*step_graph inspections' preconditions: warmed up, with steps, a valid program and
  // staging block.
  void expect_step_program(const char* what, int program, int staging) const;

  struct Entry {
    std::unique_ptr<Pipeline> pipeline;
    GraphExec exec[2];  // one per staging block
  };
  /// Where (program, bucket) is in entries_ and step_entries_.
  [[nodiscard]] std::size_t shape_index(int program, int bucket) const noexcept {
    return static_cast<std::size_t>(program) * static_cast<std::size_t>(buckets_.size()) +
           static_cast<std::size_t>(bucket);
  }
  /// not_warmed_up (also without the path: `ready` false, or a graph without capture), bad_program,
  /// or ok: the checks both launches make first.
  [[nodiscard]] RunStatus admit(int program, bool graph, bool ready) const noexcept;
  RunResult launch(const ChunkInput& chunk, int program, bool graph, cudaStream_t stream) noexcept;
  RunResult launch_step(const StepInput& step, int program, bool graph, cudaStream_t stream) noexcept;
  RunResult launch_staged(int program, bool graph, cudaStream_t stream) noexcept;
  /// The step's split and every chunk's checks against compression ratios `ratios`; false, with
  /// result refused as run(StepInput) refuses, when one fails (nothing written). Sets result.chunks.
  bool check_step(const StepInput& step, int ratios, RunResult& result) noexcept;
  /// Writes the checked step into the step staging block the next launch takes, once every
  /// launch that read it has released it; that block (0, 1), or -1 with result set when the wait failed.
  int write_step_block(int ratios, RunResult& result) noexcept;
  /// The step staged in step staging block `block`: its flat graph, step graph or (not `graph`)
  /// its kernels, of that block or (`rerun`) of a staged step run again over the device state,
  /// through submit(); sets result.chunks from the block's header and counts flat steps.
  void submit_step(int program, int block, bool rerun, bool graph, cudaStream_t stream, RunResult& result) noexcept;
  /// A chunk that passed its checks, with result.bucket set: the chunk staging block, then its
  /// bucket's chunk graph (or its kernels), or with `step_rows` its bucket's step body with that
  /// block's stage-in (a step of one chunk); `t0` is when the call began (time_host_phases).
  RunResult launch_checked(const ChunkInput& chunk, const ChunkCheck& checked, int program, bool graph,
                           bool step_rows, cudaStream_t stream, std::chrono::steady_clock::time_point t0,
                           RunResult& result) noexcept;
  // The replay path's shared parts (docs/graphs.md, "The staging hazard"): wait until staging
  // block `block` (0, 1: chunk blocks; 2, 3: step blocks) is released by every launch that read
  // it; order the launch after the last one when the stream changes, write the block's sequence
  // number (block -1: a launch that reads no staging block), launch and count the step.
  bool acquire_staging(int block, RunResult& result) noexcept;
  template <class Launch>
  void submit(int block, cudaStream_t stream, RunResult& result, Launch&& launch) noexcept;
  [[nodiscard]] kernels::StagingRelease staging_release(int block) const noexcept;
  /// The step loop's pointers for step staging block `staging` (0, 1), or for a staged step run
  /// again (-1: no staging block, no release).
  kernels::StepLoopArgs step_loop_args(int staging) const noexcept;
  PipelineBuffers pipeline_buffers() const noexcept;

  model::PipelineConfig config_;
  ExecutorOptions options_;
  BucketSet buckets_;
  std::vector<std::vector<int>> programs_;
  std::vector<int> program_ratios_;  // bit i set: program uses ratio kRatios[i]
  memory::BufferPool pool_;
  ChunkEncoder encoder_;
  std::vector<LayerBuffers> views_;  // every layer's buffers, bound or pooled
  StepWorkspace workspace_;
  std::int32_t* chunk_meta_{nullptr};
  kernels::StatusBlock* status_{nullptr};
  std::int32_t* staging_[2]{nullptr, nullptr};  // pinned staging blocks, resolved once (no lookups per step)
  core::Stream stream_;
  // The staging release words (pinned, host-mapped): kStagingBlocks sequence numbers the host
  // writes before a launch, then kStagingBlocks the device writes once the launch has read the block.
  static constexpr int kStagingBlocks = 4;
  std::uint32_t* release_words_{nullptr};
  std::uint32_t issued_[kStagingBlocks]{};  // the sequence number of the last launch that read each block
  // After each launch on a caller's stream, or on the executor's own stream when the next launch
  // is on another: what a stream change, synchronize() and the destructor wait for.
  core::Event order_;
  cudaStream_t last_stream_{nullptr};  // the stream of the last launched step
  std::vector<Entry> entries_;
  // Steps: the staging blocks, the device step state, the split's scratch, each program's step
  // graphs (one per staging block) and bucket bodies (the pipelines, in bucket order).
  StepLayout step_layout_;
  std::int32_t* step_staging_[2]{nullptr, nullptr};
  std::int32_t* step_state_{nullptr};
  std::unique_ptr<StepStager> stager_;  // the step's split, checks and buckets (scratch sized once)
  /// The step bodies ([program x bucket], step rows), each with its graphs of a step of one chunk
  /// (its stage-in from the chunk staging block, then its layers).
  std::vector<Entry> step_entries_;
  std::vector<std::vector<const Pipeline*>> bodies_;  // each program's step bodies, in bucket order
  std::int32_t* step_meta_{nullptr};  // device step blocks: every chunk's metadata, staged by head
  // [program][step_graph_slot(staging)]: the step graphs of each step staging block, then of a
  // staged step run again (no block); flat_execs_ [..][chunks - 2] the flat graphs of all-full steps.
  static constexpr int kStepGraphSlots = 3;
  [[nodiscard]] static std::size_t step_graph_slot(int staging) noexcept {
    return staging < 0 ? 2 : static_cast<std::size_t>(staging);
  }
  std::vector<std::array<GraphExec, kStepGraphSlots>> step_execs_;
  std::vector<std::array<std::vector<GraphExec>, kStepGraphSlots>> flat_execs_;
  // [program][slot][bucket]: with flat_step_chunks, a staged step of one chunk at its bucket.
  std::vector<std::array<std::vector<GraphExec>, kStepGraphSlots>> staged_one_execs_;
  int all_ratios_{0};  // every program's ratios: what stage() checks and stages
  // The staged step: which step staging block holds it (its header: the chunk count and buckets;
  // nothing rewrites the block while the step is staged), and whether a launch has loaded it into
  // the device step state and blocks (later launches run it from there).
  struct Staged {
    bool valid{false};
    bool loaded{false};
    int block{0};
  } staged_;
  void* attention_workspace_{nullptr};
  bool warmed_up_{false};
  std::uint64_t steps_{0};
  std::uint64_t flat_steps_{0};
  std::uint64_t staged_reruns_{0};
  std::uint64_t host_waits_{0};
};

}  // namespace spg::graphs
