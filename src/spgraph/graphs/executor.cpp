// Executor: see executor.hpp and docs/graphs.md.
#include "spgraph/graphs/executor.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/detail/trace.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"

namespace spg::graphs {

namespace {

/// A refused run: the status and, for bad_chunk, the request (in the caller's numbering), field and
/// reason of `why` (a ChunkCheck or a StepSplit).
template <class Why>
RunResult& refused(RunResult& result, RunStatus status, int request, const Why& why) noexcept {
  result.status = status;
  result.bad_request = request;
  result.bad_field = why.bad_field;
  result.bad_reason = why.bad_reason;
  return result;
}

std::vector<std::vector<int>> make_programs(const model::PipelineConfig& config, const ExecutorOptions& o) {
  if (o.programs.empty()) {
    std::vector<int> all(config.layers.size());
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    return {all};
  }
  for (std::size_t p = 0; p < o.programs.size(); ++p) {
    SPG_EXPECTS(!o.programs[p].empty(), "programs[" << p << "] is empty; a program needs at least one layer");
    for (int l : o.programs[p]) {
      SPG_EXPECTS(l >= 0 && l < static_cast<int>(config.layers.size()),
                  "programs[" << p << "] names layer " << l << "; layers are 0 .. " << config.layers.size() - 1);
    }
  }
  return o.programs;
}

BucketSet make_buckets(const model::PipelineConfig& config, const ExecutorOptions& o) {
  if (o.r_buckets.empty() && o.t_buckets.empty()) {
    return BucketSet::make_default(config.max_requests, config.max_tokens);
  }
  const BucketSet d = BucketSet::make_default(config.max_requests, config.max_tokens);
  return BucketSet(o.r_buckets.empty() ? d.r_buckets() : o.r_buckets,
                   o.t_buckets.empty() ? d.t_buckets() : o.t_buckets, config.max_requests, config.max_tokens);
}

std::size_t attention_headroom(const model::PipelineConfig& config, const std::vector<std::vector<int>>& programs,
                               const BucketSet& buckets) {
  std::size_t bytes = 0;
  for (const auto& layers : programs) {
    for (int b = 0; b < buckets.size(); ++b) {
      bytes = std::max(bytes, Pipeline::attention_workspace_bytes(config, layers, buckets.r_of(b), buckets.t_of(b)));
    }
  }
  return bytes;
}

/// The largest step the layer buffers must hold ({0, 0} without steps).
StepBounds step_bounds(const ExecutorOptions& o) noexcept { return StepBounds{o.max_step_requests, o.max_step_tokens}; }

/// The pool for what the caller did not bind: the bindings' device residency is checked (the one
/// binding check that asks the device) before anything is allocated.
memory::BufferPool checked_pool(const model::PipelineConfig& config, const ExecutorOptions& options,
                                const std::vector<std::vector<int>>& programs, const BucketSet& buckets,
                                memory::PoolPlan plan) {
  check_bindings(config, options.buffers, programs, options.insert, step_bounds(options));
  const std::size_t headroom = attention_headroom(config, programs, buckets);
  return memory::BufferPool(std::move(plan), headroom);
}

template <class T, std::size_t Rank>
DeviceView<T, Rank> slot_view(const memory::BufferPool& pool, const std::string& name,
                              const std::array<std::size_t, Rank>& extents) {
  const auto v = pool.view<T, Rank>(name, extents);
  return contiguous_view<T, Rank>(v.data_handle(), extents);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

/// Whether a release word holding `released` covers sequence number `need` (wrap-safe: the
/// executor's sequence numbers are never 2^31 apart among launches in flight).
bool covers(std::uint32_t released, std::uint32_t need) noexcept {
  return static_cast<std::int32_t>(released - need) >= 0;
}

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#endif
}

}  // namespace

ExecutorPlan plan_executor(model::PipelineConfig config, const ExecutorOptions& options) {
  const detail::TraceRange range(detail::TracePhase::plan);
  config.validate();  // before anything is sized from it (buckets, programs, pool)
  BucketSet buckets = make_buckets(config, options);
  std::vector<std::vector<int>> programs = make_programs(config, options);
  std::vector<int> ratios;
  for (const auto& layers : programs) {
    int mask = 0;
    for (int l : layers) mask |= 1 << ratio_index(config.layers[static_cast<std::size_t>(l)].compress_ratio);
    ratios.push_back(mask);
  }
  StepLayout step;
  if (options.max_step_requests != 0 || options.max_step_tokens != 0) {
    step = StepLayout::make(config, options.max_step_requests, options.max_step_tokens);
  }
  if (options.flat_step_chunks != 0) {
    SPG_EXPECTS(step.max_chunks > 0, "flat_step_chunks = " << options.flat_step_chunks
                                                           << " needs steps: set max_step_requests and max_step_tokens");
    SPG_EXPECTS(options.flat_step_chunks >= 2 && options.flat_step_chunks <= step.max_chunks,
                "flat_step_chunks = " << options.flat_step_chunks << " must be 0 or in [2, " << step.max_chunks
                                      << "] (the most chunks a step of these maxima splits into)");
  }
  SPG_EXPECTS(!options.flat_step_pad || options.flat_step_chunks != 0,
              "flat_step_pad = true needs flat step graphs: set flat_step_chunks");
  check_binding_shapes(config, options.buffers, programs, options.insert, step_bounds(options));
  memory::PoolPlan pool = plan_pipeline_pool(config, options.buffers, options.insert, step_bounds(options));
  plan_step_slots(pool, step);
  return ExecutorPlan{std::move(config), std::move(buckets), std::move(programs), std::move(ratios), std::move(pool),
                      step};
}

ExecutorViews executor_views(const model::PipelineConfig& config, const ExecutorOptions& options,
                             const memory::BufferPool& pool) {
  ExecutorViews out;
  out.layers.resize(config.layers.size());
  for (std::size_t i = 0; i < config.layers.size(); ++i) {
    const model::LayerConfig& l = config.layers[i];
    const LayerBuffers given = options.buffers.empty() ? LayerBuffers{} : options.buffers[i];
    LayerBuffers& v = out.layers[i];
    v = given;
    const auto h = static_cast<std::size_t>(l.h_q);
    auto planned = [&](LayerBuffer b, bool is_bound) {
      return !is_bound && layer_uses(l, b, options.insert);
    };
    auto name = [&](LayerBuffer b) { return slots::layer_slot(i, b); };
    using B = LayerBuffer;
    const std::size_t T = required_rows(config, l, B::q, step_bounds(options));  // per-token rows
    if (planned(B::q, bound(given.q))) {
      v.q = slot_view<__nv_bfloat16, 3>(pool, name(B::q), {T, h, static_cast<std::size_t>(l.d_qk)});
    }
    if (planned(B::topk_indices, bound(given.topk_indices))) {
      v.topk_indices = slot_view<std::int32_t, 2>(pool, name(B::topk_indices), {T, static_cast<std::size_t>(l.top_k)});
    }
    if (planned(B::k_rows, bound(given.k_rows))) {
      v.k_rows = slot_view<__nv_bfloat16, 2>(pool, name(B::k_rows), {T, std::size_t{model::kHeadDim}});
    }
    if (planned(B::compressed_k_rows, bound(given.compressed_k_rows))) {
      v.compressed_k_rows = slot_view<__nv_bfloat16, 2>(
          pool, name(B::compressed_k_rows),
          {required_rows(config, l, B::compressed_k_rows, step_bounds(options)), std::size_t{model::kHeadDim}});
    }
    for (const B cb : {B::swa_cache, B::compressed_cache}) {
      PagedCache& c = cb == B::swa_cache ? v.swa_cache : v.compressed_cache;
      if (planned(cb, bound(c))) {
        c.layout = required_cache(config, l, cb);
        c.data = reinterpret_cast<std::uint8_t*>(pool.bytes(name(cb), c.layout.bytes()));
      }
    }
    if (planned(B::attn_sink, bound(given.attn_sink))) v.attn_sink = slot_view<float, 1>(pool, name(B::attn_sink), {h});
    if (planned(B::out, bound(given.out))) {
      v.out = slot_view<__nv_bfloat16, 3>(pool, name(B::out), {T, h, static_cast<std::size_t>(l.d_v)});
    }
    if (planned(B::lse, bound(given.lse))) v.lse = slot_view<float, 2>(pool, name(B::lse), {T, h});
    if (planned(B::max_logits, bound(given.max_logits))) {
      v.max_logits = slot_view<float, 2>(pool, name(B::max_logits), {T, h});
    }
  }
  out.workspace.kv = slot_view<__nv_bfloat16, 3>(
      pool, slots::kKvWorkspace,
      {static_cast<std::size_t>(config.max_requests), static_cast<std::size_t>(max_kv_rows(config)),
       std::size_t{model::kHeadDim}});
  // The workspaces are a chunk's: T rows.
  const auto T = static_cast<std::size_t>(config.max_tokens);
  out.workspace.combined_indices = slot_view<std::int32_t, 2>(
      pool, slots::kCombined, {T, static_cast<std::size_t>(max_combined_width(config))});
  out.workspace.combined_lens = slot_view<std::int32_t, 1>(pool, slots::kCombinedLens, {T});
  return out;
}

Executor::Executor(model::PipelineConfig config, ExecutorOptions options)
    : Executor(plan_executor(std::move(config), options), std::move(options)) {}

Executor::Executor(ExecutorPlan plan, ExecutorOptions&& options)
    : config_(std::move(plan.config)),
      options_(std::move(options)),
      buckets_(std::move(plan.buckets)),
      programs_(std::move(plan.programs)),
      program_ratios_(std::move(plan.program_ratios)),
      pool_(checked_pool(config_, options_, programs_, buckets_, std::move(plan.pool))),
      encoder_(config_, options_.insert),
      order_(false),
      step_layout_(plan.step) {
  ExecutorViews views = executor_views(config_, options_, pool_);
  views_ = std::move(views.layers);
  workspace_ = views.workspace;

  const std::size_t meta_bytes = encoder_.layout().bytes();
  chunk_meta_ = reinterpret_cast<std::int32_t*>(pool_.bytes(slots::kChunkMeta, meta_bytes));
  status_ = reinterpret_cast<kernels::StatusBlock*>(pool_.bytes(slots::kStepStatus, sizeof(kernels::StatusBlock)));
  // Unwritten metadata must never be garbage a kernel could trust, and the run's fault totals
  // start at zero: start from zeros.
  SPG_CUDA_TRY(cudaMemsetAsync(chunk_meta_, 0, meta_bytes, stream()));
  SPG_CUDA_TRY(cudaMemsetAsync(status_, 0, sizeof(kernels::StatusBlock), stream()));
  // The pool's own input buffers (those the caller fills: q, top-k, k rows, caches, sink) start
  // defined, so that nothing reads memory nothing wrote (compute-sanitizer initcheck): warm-up runs
  // every kernel of every bucket before the caller has written anything, and the combine loads a
  // bucket's top-k rows before it knows the chunk's token count (the rows past it are never used).
  // Top-k rows start as -1, "no index"; the rest as zeros. Bound buffers are the caller's.
  for (std::size_t i = 0; i < views_.size(); ++i) {
    const LayerBuffers given = options_.buffers.empty() ? LayerBuffers{} : options_.buffers[i];
    const LayerBuffers& v = views_[i];
    auto fill = [&](const auto& view, const auto& bound_view, int value) {
      if (bound(bound_view) || view.data_handle() == nullptr) return;
      SPG_CUDA_TRY(cudaMemsetAsync(view.data_handle(), value,
                                   view.mapping().required_span_size() * sizeof(*view.data_handle()), stream()));
    };
    fill(v.q, given.q, 0);
    fill(v.topk_indices, given.topk_indices, 0xff);
    fill(v.k_rows, given.k_rows, 0);
    fill(v.compressed_k_rows, given.compressed_k_rows, 0);
    fill(v.attn_sink, given.attn_sink, 0);
    for (const auto& [cache, bound_cache] : {std::pair{v.swa_cache, given.swa_cache},
                                             std::pair{v.compressed_cache, given.compressed_cache}}) {
      if (!bound(bound_cache) && cache.data != nullptr) {
        SPG_CUDA_TRY(cudaMemsetAsync(cache.data, 0, cache.bytes(), stream()));
      }
    }
  }
  for (int s = 0; s < 2; ++s) {
    staging_[s] = reinterpret_cast<std::int32_t*>(pool_.bytes(slots::kStaging[s], meta_bytes));
    std::memset(staging_[s], 0, meta_bytes);
  }
  release_words_ = reinterpret_cast<std::uint32_t*>(pool_.bytes(slots::kStagingRelease, kStagingReleaseBytes));
  std::memset(release_words_, 0, kStagingReleaseBytes);
  if (step_layout_.max_chunks > 0) {
    step_state_ = reinterpret_cast<std::int32_t*>(
        pool_.bytes(slots::kStepState, static_cast<std::size_t>(step_layout_.header_words) * 4));
    SPG_CUDA_TRY(cudaMemsetAsync(step_state_, 0, static_cast<std::size_t>(step_layout_.header_words) * 4, stream()));
    step_meta_ = reinterpret_cast<std::int32_t*>(pool_.bytes(slots::kStepMeta, step_layout_.meta_bytes()));
    SPG_CUDA_TRY(cudaMemsetAsync(step_meta_, 0, step_layout_.meta_bytes(), stream()));
    for (int s = 0; s < 2; ++s) {
      step_staging_[s] = reinterpret_cast<std::int32_t*>(pool_.bytes(slots::kStepStaging[s], step_layout_.bytes()));
      std::memset(step_staging_[s], 0, step_layout_.bytes());
    }
    for (int staging = -1; staging < 2; ++staging) kernels::StepLoop::can_implement(step_loop_args(staging));
    for (int mask : program_ratios_) all_ratios_ |= mask;
    stager_ = std::make_unique<StepStager>(config_, step_layout_, buckets_, encoder_);
  }
  SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
}

void Executor::check_options(const model::PipelineConfig& config, const ExecutorOptions& options) {
  (void)plan_executor(config, options);  // the constructor's host-only checks, in its order
}

Executor::~Executor() {
  // Graphs and the pool must not be torn down under running work, on whichever stream it runs:
  // every launch is ordered before the last one, which order_ marks when it ran on a caller's stream.
  if (steps_ > 0 && last_stream_ != stream_.get()) {
    core::detail::report_release_failure("executor step", cudaEventSynchronize(order_.get()));
  }
  core::detail::report_release_failure("executor stream work", cudaStreamSynchronize(stream_.get()));
}

static_assert(kStagingReleaseBytes == 2 * sizeof(std::uint32_t) * 4, "two words per staging block");

kernels::StagingRelease Executor::staging_release(int block) const noexcept {
  kernels::StagingRelease r;
  r.sequence = release_words_ + block;
  r.released = release_words_ + kStagingBlocks + block;
  r.arrivals = status_->staging_arrivals + block;
  return r;
}

PipelineBuffers Executor::pipeline_buffers() const noexcept {
  PipelineBuffers b;
  for (int s = 0; s < 2; ++s) {
    b.staging[s] = reinterpret_cast<const std::byte*>(staging_[s]);
    b.release[s] = staging_release(s);
  }
  b.chunk_meta = chunk_meta_;
  b.status = status_;
  b.workspace = workspace_;
  b.attention_workspace = attention_workspace_;
  b.layers = &views_;
  return b;
}

WarmupReport Executor::warmup() {
  SPG_EXPECTS_AS(StateError, !warmed_up_, "Executor::warmup: already warmed up");
  const detail::TraceRange range(detail::TracePhase::warmup);
  WarmupReport report;
  report.buckets = buckets_.size();
  report.programs = programs();

  // A warm-up that failed part-way may be called again: the workspace carved then is reused, and
  // the recordings and graphs are only kept once all of them exist.
  const std::size_t ws_bytes = attention_headroom(config_, programs_, buckets_);
  if (ws_bytes > 0) {
    if (pool_.plan().find(slots::kAttentionWorkspace) == nullptr) {
      pool_.carve(memory::SlotSpec{slots::kAttentionWorkspace, ws_bytes, 256, memory::MemoryKind::device,
                                   "split-top-k partials"});
    }
    attention_workspace_ = pool_.bytes(slots::kAttentionWorkspace, ws_bytes);
  }

  std::vector<Entry> entries(programs_.size() * static_cast<std::size_t>(buckets_.size()));
  const PipelineBuffers buffers = pipeline_buffers();
  // With steps, the step graph's bucket bodies: the same stages on a step's rows (step_rows); their
  // execs are the graphs of steps of one chunk.
  std::vector<Entry> step_entries(step_layout_.max_chunks > 0 ? entries.size() : 0);
  std::vector<std::vector<const Pipeline*>> bodies(programs_.size());
  {
    const detail::TraceRange prepare(detail::TracePhase::prepare);
    for (int p = 0; p < programs(); ++p) {
      for (int b = 0; b < buckets_.size(); ++b) {
        entries[shape_index(p, b)].pipeline = std::make_unique<Pipeline>(
            config_, buffers, programs_[static_cast<std::size_t>(p)], buckets_.r_of(b), buckets_.t_of(b), options_.insert);
        if (step_layout_.max_chunks == 0) continue;
        step_entries[shape_index(p, b)].pipeline =
            std::make_unique<Pipeline>(config_, buffers, programs_[static_cast<std::size_t>(p)], buckets_.r_of(b),
                                       buckets_.t_of(b), options_.insert, /*step_rows=*/true);
        bodies[static_cast<std::size_t>(p)].push_back(step_entries[shape_index(p, b)].pipeline.get());
      }
    }
  }
  report.kernel_launches_per_step = entries[static_cast<std::size_t>(buckets_.size()) - 1].pipeline->kernel_launches();

  // One eager pass over every shape with an empty chunk: loads every kernel and checks every launch.
  const ChunkInput empty{};
  const ChunkCheck checked = encoder_.check(empty, program_ratios_[0]);
  SPG_EXPECTS_AS(StateError, checked.status == RunStatus::ok,
                 "warm-up: the empty chunk was refused: " << run_status_name(checked.status));
  std::chrono::steady_clock::time_point t0;
  {
    const detail::TraceRange eager_pass(detail::TracePhase::eager_pass);
    encoder_.write(empty, checked, program_ratios_[0], staging_[0]);
    t0 = std::chrono::steady_clock::now();
    for (auto& e : entries) SPG_CUDA_TRY(e.pipeline->record(0, stream()));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
  }
  report.eager_ms = ms_since(t0);

  // An entry's graphs, one per staging block: its pipeline recorded whole.
  const auto capture_entry = [&](Entry& e, int bucket) {
    for (int s = 0; s < 2; ++s) {
      const Graph graph = [&] {
        const detail::TraceRange capture(detail::TracePhase::capture, bucket);
        CaptureGuard guard(stream());
        SPG_CUDA_TRY(e.pipeline->record(s, stream()));
        return guard.finish();
      }();
      const detail::TraceRange instantiate(detail::TracePhase::instantiate, bucket);
      e.exec[s] = GraphExec::instantiate(graph, stream());
    }
  };
  std::size_t free_before = 0;
  std::size_t free_after = 0;
  std::size_t total = 0;
  if (options_.capture) {
    SPG_CUDA_TRY(cudaMemGetInfo(&free_before, &total));
    t0 = std::chrono::steady_clock::now();
    for (int p = 0; p < programs(); ++p) {
      for (int b = buckets_.size() - 1; b >= 0; --b) {  // largest first
        capture_entry(entries[shape_index(p, b)], b);
        report.graphs += 2;
      }
    }
    SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
    report.capture_ms = ms_since(t0);
  }
  std::vector<std::array<GraphExec, kStepGraphSlots>> step_execs;
  std::vector<std::array<std::vector<GraphExec>, kStepGraphSlots>> flat_execs;
  std::vector<std::array<std::vector<GraphExec>, kStepGraphSlots>> staged_one_execs;
  if (step_layout_.max_chunks > 0) {
    // The step kernels' eager pass: one chunk (the empty one) at bucket 0 through program 0's
    // body, then every body once on that chunk's metadata.
    const int one[1] = {0};
    std::int32_t* const block = step_staging_[0];
    block[kernels::StepStateWords::count] = 1;
    block[kernels::StepStateWords::fast] = 0;
    block[kernels::StepStateWords::buckets] = 0;
    encoder_.write(empty, checked, program_ratios_[0], block + step_layout_.chunk_offset(0));
    SPG_CUDA_TRY(record_step_eager(step_loop_args(0), bodies[0], one, stream()));
    for (const Entry& e : step_entries) SPG_CUDA_TRY(e.pipeline->record_layers(stream()));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
    block[kernels::StepStateWords::count] = 0;
    if (options_.capture) {
      const auto t1 = std::chrono::steady_clock::now();
      // Per program and staging slot (the two step staging blocks, then a staged step run again
      // over the device state): the step graph, and with flat_step_chunks the plain graphs of
      // steps of 2 .. flat_step_chunks chunks (the largest body's) and of one chunk at each
      // bucket (a staged step's: run(StepInput) launches a step of one chunk as a chunk).
      step_execs.resize(programs_.size());
      flat_execs.resize(programs_.size());
      staged_one_execs.resize(programs_.size());
      const int flat_graphs = options_.flat_step_chunks > 0 ? options_.flat_step_chunks - 1 : 0;
      for (std::size_t p = 0; p < programs_.size(); ++p) {
        for (const int staging : {0, 1, -1}) {
          const std::size_t slot = step_graph_slot(staging);
          const kernels::StepLoopArgs args = step_loop_args(staging);
          step_execs[p][slot] = GraphExec::instantiate(build_step_graph(args, bodies[p], stream()).graph, stream());
          for (int k = 2; k <= options_.flat_step_chunks; ++k) {
            flat_execs[p][slot].push_back(
                GraphExec::instantiate(build_flat_step_graph(args, *bodies[p].back(), k, stream()), stream()));
          }
          if (options_.flat_step_chunks > 0) {
            for (const Pipeline* body : bodies[p]) {
              staged_one_execs[p][slot].push_back(
                  GraphExec::instantiate(build_flat_step_graph(args, *body, 1, stream()), stream()));
            }
            report.staged_one_chunk_graphs += static_cast<int>(bodies[p].size());
          }
          if (staging < 0) {
            report.staged_step_graphs += 1 + flat_graphs;
          } else {
            ++report.step_graphs;
            report.flat_step_graphs += flat_graphs;
          }
        }
      }
      // Steps of one chunk: every body behind the chunk staging block's stage-in.
      for (int p = 0; p < programs(); ++p) {
        for (int b = 0; b < buckets_.size(); ++b) {
          capture_entry(step_entries[shape_index(p, b)], b);
          report.one_chunk_step_graphs += 2;
        }
      }
      SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
      report.capture_ms += ms_since(t1);
    }
  }
  if (options_.capture) {
    SPG_CUDA_TRY(cudaMemGetInfo(&free_after, &total));
    report.graph_device_bytes = static_cast<std::int64_t>(free_before) - static_cast<std::int64_t>(free_after);
  }
  entries_ = std::move(entries);
  step_entries_ = std::move(step_entries);
  bodies_ = std::move(bodies);
  step_execs_ = std::move(step_execs);
  flat_execs_ = std::move(flat_execs);
  staged_one_execs_ = std::move(staged_one_execs);
  staged_ = Staged{};
  pool_.seal();
  report.pool_device_bytes = pool_.device_bytes();
  report.pool_pinned_bytes = pool_.pinned_bytes();
  report.pool_allocation_calls = pool_.allocation_calls();
  warmed_up_ = true;
  return report;
}

Graph Executor::record_graph(int program, int bucket, int staging) const {
  SPG_EXPECTS_AS(StateError, warmed_up_, "Executor::record_graph: warmup() has not run");
  core::Stream s;
  CaptureGuard guard(s.get());
  SPG_CUDA_TRY(pipeline(program, bucket).record(staging, s.get()));
  return guard.finish();
}

RunStatus Executor::admit(int program, bool graph, bool ready) const noexcept {
  if (!ready || !warmed_up_ || (graph && !options_.capture)) return RunStatus::not_warmed_up;
  if (program < 0 || program >= programs()) return RunStatus::bad_program;
  return RunStatus::ok;
}

RunResult Executor::launch(const ChunkInput& chunk, int program, bool graph, cudaStream_t stream) noexcept {
  RunResult result;
  result.status = admit(program, graph, true);
  if (result.status != RunStatus::ok) return result;
  const detail::TraceRange range(graph ? detail::TracePhase::step_graph : detail::TracePhase::step_eager);
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const Clock::time_point t0 = timed ? Clock::now() : Clock::time_point{};
  const int mask = program_ratios_[static_cast<std::size_t>(program)];
  const ChunkCheck checked = encoder_.check(chunk, mask);
  if (checked.status != RunStatus::ok) return refused(result, checked.status, checked.bad_request, checked);
  result.bucket = buckets_.lookup(checked.requests, checked.tokens);
  if (result.bucket < 0) {
    result.status = RunStatus::no_bucket;
    return result;
  }
  return launch_checked(chunk, checked, program, graph, /*step_rows=*/false, stream, t0, result);
}

RunResult Executor::launch_checked(const ChunkInput& chunk, const ChunkCheck& checked, int program, bool graph,
                                   bool step_rows, cudaStream_t stream, std::chrono::steady_clock::time_point t0,
                                   RunResult& result) noexcept {
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const int mask = program_ratios_[static_cast<std::size_t>(program)];
  const int s = static_cast<int>(steps_ & 1);
  if (!acquire_staging(s, result)) return result;
  encoder_.write(chunk, checked, mask, staging_[s]);
  const Entry& e = (step_rows ? step_entries_ : entries_)[shape_index(program, result.bucket)];
  const Clock::time_point t1 = timed ? Clock::now() : Clock::time_point{};
  submit(s, stream, result, [&] { return graph ? e.exec[s].launch(stream) : e.pipeline->record(s, stream); });
  // Staging excludes the wait for a staging block (waited_us: the device's time, not the host's).
  if (timed) result.phases.staging_us = std::chrono::duration<double, std::micro>(t1 - t0).count() - result.waited_us;
  return result;
}

bool Executor::acquire_staging(int block, RunResult& result) noexcept {
  // The staging hazard (docs/graphs.md): the kernel that reads a staging block last in a launch
  // stores the launch's sequence number into the block's release word once its reads have
  // returned. The block is free when that word covers the last launch that read it; the host
  // waits only when the device has not got that far, and never calls CUDA on the way through.
  const std::atomic_ref<std::uint32_t> released(release_words_[kStagingBlocks + block]);
  const std::uint32_t need = issued_[block];
  if (covers(released.load(std::memory_order_acquire), need)) return true;
  using Clock = std::chrono::steady_clock;
  ++host_waits_;
  const auto w0 = Clock::now();
  for (unsigned spin = 1;; ++spin) {
    cpu_relax();
    if (covers(released.load(std::memory_order_acquire), need)) break;
    // Now and then ask whether everything submitted has finished (every launch is ordered before
    // the last one): then the block is free whatever the word says, and an error on the way
    // (a fault that stopped the launch before its release) is reported, not waited on forever.
    if (spin % 64 == 0) {
      const cudaError_t q = last_stream_ == stream_.get() ? cudaStreamQuery(stream_.get()) : cudaEventQuery(order_.get());
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        result.status = RunStatus::cuda_error;
        result.cuda = q;
        return false;
      }
    }
  }
  result.waited_us = std::chrono::duration<double, std::micro>(Clock::now() - w0).count();
  return true;
}

template <class Launch>
void Executor::submit(int block, cudaStream_t stream, RunResult& result, Launch&& launch) noexcept {
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const Clock::time_point t1 = timed ? Clock::now() : Clock::time_point{};
  // Steps share the pool's metadata block and workspaces: a step on another stream than the last
  // one waits for it on the device, through order_: recorded after the last launch when that was
  // on a caller's stream, or now on the executor's own stream (which lives as long as it does).
  // A launch on the executor's own stream records nothing.
  const bool own = stream == stream_.get();
  cudaError_t err = cudaSuccess;
  if (steps_ > 0 && stream != last_stream_) {
    if (last_stream_ == stream_.get()) err = cudaEventRecord(order_.get(), last_stream_);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(stream, order_.get(), 0);
  }
  const Clock::time_point t2 = timed ? Clock::now() : Clock::time_point{};
  // The launch's sequence number, read by the device beside the block (the block's previous
  // readers have released it, so none of them still reads this word).
  const auto sequence = static_cast<std::uint32_t>(steps_ + 1);
  if (block >= 0) std::atomic_ref<std::uint32_t>(release_words_[block]).store(sequence, std::memory_order_release);
  if (err == cudaSuccess) err = launch();
  const Clock::time_point t3 = timed ? Clock::now() : Clock::time_point{};
  // After a launch on a caller's stream the executor never uses that stream again (the caller may
  // destroy it): the event marks the launch for the next stream change, synchronize() and the
  // destructor.
  if (err == cudaSuccess && !own) err = cudaEventRecord(order_.get(), stream);
  if (timed) {
    using Us = std::chrono::duration<double, std::micro>;
    result.phases.launch_us = Us(t3 - t2).count();
    result.phases.record_us = Us(t2 - t1).count() + Us(Clock::now() - t3).count();
  }
  if (err != cudaSuccess) {
    // Part of the step may be queued and still read the staging block: let it drain before the
    // block can be written again (the error path only).
    (void)cudaStreamSynchronize(stream);
    result.status = RunStatus::cuda_error;
    result.cuda = err;
    return;
  }
  if (block >= 0) issued_[block] = sequence;
  last_stream_ = stream;
  ++steps_;
}

kernels::StepLoopArgs Executor::step_loop_args(int staging) const noexcept {
  kernels::StepLoopArgs a;
  a.staging = staging < 0 ? nullptr : step_staging_[staging & 1];
  a.state = step_state_;
  a.max_chunks = step_layout_.max_chunks;
  a.chunk_bytes = static_cast<std::size_t>(step_layout_.chunk_words) * 4;
  a.header_words = step_layout_.header_words;
  a.step_meta = step_meta_;
  a.chunk_meta = chunk_meta_;
  a.status = status_;
  if (staging >= 0) a.release = staging_release(2 + (staging & 1));
  return a;
}

RunResult Executor::launch_step(const StepInput& step, int program, bool graph, cudaStream_t stream) noexcept {
  RunResult result;
  result.status = admit(program, graph, step_layout_.max_chunks > 0);  // no step options: no step path
  if (result.status != RunStatus::ok) return result;
  const detail::TraceRange range(graph ? detail::TracePhase::step_graph : detail::TracePhase::step_eager);
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const Clock::time_point t0 = timed ? Clock::now() : Clock::time_point{};
  const int mask = program_ratios_[static_cast<std::size_t>(program)];
  if (!check_step(step, mask, result)) return result;
  // This step writes a step staging block or the device step state: a staged step is gone.
  staged_.valid = false;
  // A step of one chunk is launched as a chunk: the chunk staging block and its bucket's step body
  // behind that block's stage-in (or those kernels, eager). The same rows as the step loop's
  // first chunk, without the loop's head, WHILE, SWITCH and tail (docs/graphs.md, "Steps").
  if (result.chunks == 1) {
    result.bucket = stager_->buckets()[0];
    return launch_checked(stager_->splitter().chunk(0), stager_->chunk_check(0), program, graph, /*step_rows=*/true,
                          stream, t0, result);
  }
  const int s = write_step_block(mask, result);
  if (s < 0) return result;
  const Clock::time_point t1 = timed ? Clock::now() : Clock::time_point{};
  submit_step(program, s, /*rerun=*/false, graph, stream, result);
  // Staging excludes the wait for a staging block (waited_us: the device's time, not the host's).
  if (timed) result.phases.staging_us = std::chrono::duration<double, std::micro>(t1 - t0).count() - result.waited_us;
  return result;
}

bool Executor::check_step(const StepInput& step, int ratios, RunResult& result) noexcept {
  // Every chunk is checked before anything is written: a refused step leaves the staging blocks as they were.
  const StepCheck checked = stager_->check(step, ratios);
  result.chunks = checked.chunks;
  if (checked.status == RunStatus::ok) return true;
  result.bad_chunk = checked.bad_chunk;
  refused(result, checked.status, checked.bad_request, checked);
  return false;
}

int Executor::write_step_block(int ratios, RunResult& result) noexcept {
  // The block the next launch takes: free once every launch that read it has released it.
  const int s = static_cast<int>(steps_ & 1);
  if (!acquire_staging(2 + s, result)) return -1;
  stager_->write(ratios, step_staging_[s]);
  return s;
}

RunResult Executor::run(const StepInput& step, int program, cudaStream_t stream) noexcept {
  return launch_step(step, program, true, stream);
}
RunResult Executor::run_eager(const StepInput& step, int program, cudaStream_t stream) noexcept {
  return launch_step(step, program, false, stream);
}

RunResult Executor::stage(const StepInput& step) noexcept {
  RunResult result;
  result.status = admit(0, false, step_layout_.max_chunks > 0);
  if (result.status != RunStatus::ok) return result;
  using Clock = std::chrono::steady_clock;
  const bool timed = options_.time_host_phases;
  const Clock::time_point t0 = timed ? Clock::now() : Clock::time_point{};
  if (!check_step(step, all_ratios_, result)) return result;
  staged_.valid = false;
  const int s = write_step_block(all_ratios_, result);
  if (s < 0) return result;
  staged_ = Staged{true, false, s};
  if (timed) {
    result.phases.staging_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() - result.waited_us;
  }
  return result;
}

RunResult Executor::launch_staged(int program, bool graph, cudaStream_t stream) noexcept {
  RunResult result;
  result.status = admit(program, graph, step_layout_.max_chunks > 0);
  if (result.status != RunStatus::ok) return result;
  if (!staged_.valid) {
    result.status = RunStatus::not_staged;
    return result;
  }
  const detail::TraceRange range(graph ? detail::TracePhase::step_graph : detail::TracePhase::step_eager);
  // The first launch reads the staging block (head loads the device state and blocks, tail
  // releases the block); a later one reads only the device state, and no block.
  const bool rerun = staged_.loaded;
  submit_step(program, staged_.block, rerun, graph, stream, result);
  if (result.ok()) {
    staged_.loaded = true;
    if (rerun) ++staged_reruns_;
  }
  return result;
}

void Executor::submit_step(int program, int block, bool rerun, bool graph, cudaStream_t stream,
                           RunResult& result) noexcept {
  // The step as the host staged it in `block`: its header names the chunks and their bodies.
  const std::int32_t* const header = step_staging_[block];
  const int chunks = header[kernels::StepStateWords::count];
  result.chunks = chunks;
  const std::size_t p = static_cast<std::size_t>(program);
  const std::size_t slot = step_graph_slot(rerun ? -1 : block);
  // An all-full step (every chunk on the largest bucket: the first loop's whole) within
  // flat_step_chunks launches its plain graph, with flat_step_pad any step within it; a step of
  // one chunk (staged: run(StepInput) launches it as a chunk), with flat_step_chunks, the plain
  // graph of its bucket; any other the step graph (a step of no chunk too: it runs none).
  // Eager, the bodies the header names, as the step graph runs them (its first loop's included).
  const int flat_max = options_.flat_step_chunks;
  const bool one = graph && chunks == 1 && flat_max > 0;
  const bool flat = graph && chunks >= 2 && chunks <= flat_max &&
                    (options_.flat_step_pad || header[kernels::StepStateWords::fast] == chunks);
  const std::span<const int> buckets(header + kernels::StepStateWords::buckets, static_cast<std::size_t>(chunks));
  submit(rerun ? -1 : 2 + block, stream, result, [&] {
    if (one) {
      return staged_one_execs_[p][slot][static_cast<std::size_t>(header[kernels::StepStateWords::buckets])].launch(stream);
    }
    if (flat) return flat_execs_[p][slot][static_cast<std::size_t>(chunks - 2)].launch(stream);
    return graph ? step_execs_[p][slot].launch(stream)
                 : record_step_eager(step_loop_args(rerun ? -1 : block), bodies_[p], buckets, stream);
  });
  if ((flat || one) && result.ok()) ++flat_steps_;
}

RunResult Executor::run_staged(int program, cudaStream_t stream) noexcept { return launch_staged(program, true, stream); }
RunResult Executor::run_staged_eager(int program, cudaStream_t stream) noexcept {
  return launch_staged(program, false, stream);
}

void Executor::expect_step_program(const char* what, int program, int staging) const {
  SPG_EXPECTS_AS(StateError, warmed_up_, "Executor::" << what << ": warmup() has not run");
  SPG_EXPECTS_AS(StateError, step_layout_.max_chunks > 0,
                 "Executor::" << what << ": the executor has no steps (max_step_requests = 0)");
  SPG_EXPECTS(program >= 0 && program < programs(),
              "program = " << program << " must be in [0, " << programs() << ")");
  SPG_EXPECTS(staging >= -1 && staging <= 1,
              "staging = " << staging << " must be 0, 1 or -1 (a staged step run again)");
}

StepGraph Executor::record_step_graph(int program, int staging) const {
  expect_step_program("record_step_graph", program, staging);
  core::Stream s;
  return build_step_graph(step_loop_args(staging), bodies_.at(static_cast<std::size_t>(program)), s.get());
}

Graph Executor::record_flat_step_graph(int program, int chunks, int staging) const {
  expect_step_program("record_flat_step_graph", program, staging);
  core::Stream s;
  return build_flat_step_graph(step_loop_args(staging), *bodies_.at(static_cast<std::size_t>(program)).back(), chunks,
                               s.get());
}

RunResult Executor::run(const ChunkInput& chunk, int program, cudaStream_t stream) noexcept {
  return launch(chunk, program, true, stream);
}
RunResult Executor::run_eager(const ChunkInput& chunk, int program, cudaStream_t stream) noexcept {
  return launch(chunk, program, false, stream);
}

void Executor::synchronize() const {
  if (steps_ > 0 && last_stream_ != stream()) SPG_CUDA_TRY(cudaEventSynchronize(order_.get()));
  SPG_CUDA_TRY(cudaStreamSynchronize(stream()));
}

kernels::StepStatus Executor::read_status() const {
  kernels::StepStatus status{};
  synchronize();
  SPG_CUDA_TRY(cudaMemcpy(&status, &status_->step, sizeof status, cudaMemcpyDeviceToHost));
  return status;
}

kernels::RunFaults Executor::read_run_faults() const {
  kernels::StatusBlock block{};
  synchronize();
  SPG_CUDA_TRY(cudaMemcpy(&block, status_, sizeof block, cudaMemcpyDeviceToHost));
  kernels::RunFaults run = block.run;
  run.add(block.step);  // the last step's counts, which no stage-in has folded in yet
  return run;
}

}  // namespace spg::graphs
