// serve_loop: spgraph's main job. A synthetic stream of prompts is prefilled chunk by chunk by the
// scheduler and the graph executor (one graph launch per chunk), then a report is printed.
// Without a CUDA device it says so and prints the planned pool (the CPU-side planner).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/kernels/checksum/checksum.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"
#include "spgraph/memory/allocation_counter.hpp"
#include "spgraph/model/pipeline_config.hpp"
#include "samples/bench/report.hpp"
#include "samples/engine_buffers.hpp"
#include "samples/serve_loop_options.hpp"
#include "samples/serve_loop_verify.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"
#include "spgraph/scheduler/workload.hpp"

namespace {

using Options = spg::samples::ServeLoopOptions;

spg::model::PipelineConfig make_config(const Options& o) {
  spg::model::PipelineConfig c = spg::model::PipelineConfig::v4_default();
  c.max_requests = o.max_requests;
  c.max_tokens = o.max_tokens;
  c.max_model_len = o.max_model_len;
  c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request();
  c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request();
  return c;
}

void print_plan(const spg::model::PipelineConfig& config, const Options& opt) {
  const bool engine_buffers = opt.engine_buffers;
  // With --engine-buffers the model front owns every layer buffer: the pool plans only its own.
  const spg::graphs::StepBounds step =
      opt.one_launch ? spg::graphs::StepBounds{opt.step_requests, opt.budget} : spg::graphs::StepBounds{};
  auto plan = spg::graphs::plan_pipeline_pool(
      config, [&](std::size_t, spg::graphs::LayerBuffer) { return engine_buffers; }, true, step);
  if (opt.one_launch) {
    spg::graphs::plan_step_slots(plan, spg::graphs::StepLayout::make(config, opt.step_requests, opt.budget));
  }
  std::printf("layer program: %zu layers (R = %d, T = %d, max_model_len = %d)\n", config.layers.size(),
              config.max_requests, config.max_tokens, config.max_model_len);
  for (std::size_t i = 0; i < config.layers.size(); ++i) {
    std::printf("  layer %zu: %s\n", i, config.layers[i].label().c_str());
  }
  std::printf("buckets: %s\n%s\n%s", spg::graphs::BucketSet::make_default(config.max_requests, config.max_tokens).describe().c_str(),
              engine_buffers ? "every layer buffer is the engine's (--engine-buffers): the pool plans spgraph's own slots\n" : "",
              plan.table().c_str());
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const std::size_t i = static_cast<std::size_t>(std::min<double>(static_cast<double>(v.size() - 1), p * static_cast<double>(v.size())));
  return v[i];
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

class Progress {
 public:
  Progress(long total, bool enabled) : total_(total), enabled_(enabled), tty_(isatty(STDERR_FILENO) != 0) {}
  void update(long done) {
    if (!enabled_) return;
    const int pct = static_cast<int>(100 * done / total_);
    if (pct == last_ || (!tty_ && pct % 10 != 0)) return;
    last_ = pct;
    if (tty_) {
      const int width = 40;
      const int fill = pct * width / 100;
      std::fprintf(stderr, "\r[%.*s%*s] %3d%% (%ld/%ld steps)", fill, "########################################",
                   width - fill, "", pct, done, total_);
      if (done == total_) std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "progress: %d%% (%ld/%ld steps)\n", pct, done, total_);
    }
  }

 private:
  long total_;
  bool enabled_;
  bool tty_;
  int last_{-1};
};

/// The model front's fixed part: query rows (random, once; every row of the buffer, a whole
/// step's with --one-launch) and the sinks.
void fill_model_front(const spg::graphs::Executor& ex, std::uint64_t seed) {
  using namespace spg;
  const model::PipelineConfig& config = ex.config();
  for (std::size_t l = 0; l < config.layers.size(); ++l) {
    const auto& layer = config.layers[l];
    const graphs::LayerBuffers& v = ex.layer(l);
    const std::size_t elems = static_cast<std::size_t>(v.q.extent(0)) * static_cast<std::size_t>(layer.h_q) *
                              static_cast<std::size_t>(layer.d_qk);
    SPG_EXPECTS(v.q.stride(0) == static_cast<std::size_t>(layer.h_q) * layer.d_qk &&
                    v.out.stride(0) == static_cast<std::size_t>(layer.h_q) * layer.d_v,
                "serve_loop fills q and checksums out as contiguous [T, h_q, d] tensors");
    SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(v.q.data_handle(), elems, seed, static_cast<int>(l), ex.stream()));
    if (layer.attn_sink) {
      std::vector<float> sink(static_cast<std::size_t>(layer.h_q));
      for (std::size_t h = 0; h < sink.size(); ++h) {
        sink[h] = 4.0F * kernels::front_q_value(seed + 7, static_cast<int>(l), h);
      }
      SPG_CUDA_TRY(cudaMemcpy(v.attn_sink.data_handle(), sink.data(), sink.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // the sinks were copied on the legacy stream
}

/// The synthetic prompt stream: a new batch of requests whenever the scheduler has run dry.
class PromptStream {
 public:
  explicit PromptStream(const Options& o) : seed_(o.seed) {
    wc_.num_requests = o.requests;
    wc_.min_prompt_len = o.min_len;
    wc_.max_prompt_len = o.max_len;
    wc_.lengths = o.lengths;
    wc_.arrivals = o.arrivals;
    wc_.arrival_rate = o.rate;
  }
  [[nodiscard]] std::string describe() const { return wc_.describe(); }
  void refill(spg::scheduler::PrefillScheduler& sched) {
    if (!sched.done()) return;
    wc_.seed = seed_ * 1000003ULL + static_cast<std::uint64_t>(batch_++);
    wc_.first_step = sched.next_step();
    auto reqs = spg::scheduler::make_workload(wc_);
    for (auto& r : reqs) r.id = next_id_++;
    sched.submit(reqs);
  }

 private:
  std::uint64_t seed_;
  spg::scheduler::WorkloadConfig wc_;
  std::int64_t next_id_{0};
  int batch_{0};
};

/// GPU time per launch (a chunk, or a whole step with --one-launch) from a ring of event pairs,
/// each read back a ring's length later, so the host never waits for work it has just launched.
class GpuTimes {
 public:
  static constexpr int kRing = 64;
  GpuTimes() {
    for (int i = 0; i < kRing; ++i) {
      start_.emplace_back();
      stop_.emplace_back();
    }
  }
  /// Before launch `c`'s work: reads back launch c - kRing's time (waiting for it), records c's start.
  void start(long long c, cudaStream_t stream) {
    const auto slot = static_cast<std::size_t>(c % kRing);
    if (c >= kRing) {
      stop_[slot].synchronize();
      us_.push_back(1000.0 * stop_[slot].elapsed_ms_since(start_[slot]));
    }
    start_[slot].record(stream);
  }
  void stop(long long c, cudaStream_t stream) { stop_[static_cast<std::size_t>(c % kRing)].record(stream); }
  /// After the device is idle: the last `launches`' times too; then every launch's.
  const std::vector<double>& finish(long long launches) {
    for (long long c = std::max<long long>(0, launches - kRing); c < launches; ++c) {
      const auto slot = static_cast<std::size_t>(c % kRing);
      us_.push_back(1000.0 * stop_[slot].elapsed_ms_since(start_[slot]));
    }
    return us_;
  }

 private:
  std::vector<spg::core::Event> start_;
  std::vector<spg::core::Event> stop_;
  std::vector<double> us_;
};

/// A checksum of every launch's outputs (out, lse, max_logits of every layer), on the device: a
/// chunk's t_bucket rows, or a step's rows [0, step tokens) with --one-launch.
class OutputChecksum {
 public:
  OutputChecksum() : acc_(sizeof(std::uint64_t)) { SPG_CUDA_TRY(cudaMemset(acc_.data(), 0, sizeof(std::uint64_t))); }
  /// Adds token rows [0, token_rows) of every layer's outputs, salted by the launch's index.
  void add(const spg::graphs::Executor& ex, int token_rows, long long launch) {
    using namespace spg;
    const model::PipelineConfig& config = ex.config();
    for (std::size_t l = 0; l < config.layers.size(); ++l) {
      const graphs::LayerBuffers& v = ex.layer(l);
      SPG_EXPECTS(token_rows >= 0 && static_cast<std::size_t>(token_rows) <= static_cast<std::size_t>(v.out.extent(0)),
                  "OutputChecksum: " << token_rows << " token rows, the buffers hold " << v.out.extent(0));
      const std::size_t rows = std::size_t{1} * static_cast<std::size_t>(token_rows) * static_cast<std::size_t>(config.layers[l].h_q);
      auto* acc = static_cast<std::uint64_t*>(acc_.data());
      const auto salt = static_cast<std::uint64_t>(launch) << 32 | l << 8;
      SPG_CUDA_TRY(kernels::Checksum::accumulate(v.out.data_handle(), rows * 1024, salt, acc, ex.stream()));
      SPG_CUDA_TRY(kernels::Checksum::accumulate(v.lse.data_handle(), rows * 4, salt + 1, acc, ex.stream()));
      SPG_CUDA_TRY(kernels::Checksum::accumulate(v.max_logits.data_handle(), rows * 4, salt + 2, acc, ex.stream()));
    }
  }
  [[nodiscard]] std::uint64_t read() const {
    std::uint64_t sum = 0;
    SPG_CUDA_TRY(cudaMemcpy(&sum, acc_.data(), sizeof sum, cudaMemcpyDeviceToHost));
    return sum;
  }

 private:
  spg::core::DeviceBuffer acc_;
};

/// What the loop counted and timed.
struct LoopStats {
  std::vector<double> host_us;       // per launch (run() call), waits for the device excluded
  std::vector<double> step_host_us;  // per scheduler step, everything included
  std::vector<double> gpu_us;        // per launch
  long long chunks{0};
  long long launches{0};  // run() calls: one per chunk, or one per step with --one-launch
  long long tokens{0};
  long long padded{0};
  long long graph_hits{0};
  long long eager_runs{0};
  long long finished{0};
  double waited_us{0};
  double wall_s{0};
  [[nodiscard]] double tokens_per_s() const { return static_cast<double>(tokens) / wall_s; }
  [[nodiscard]] double waste() const { return tokens > 0 ? static_cast<double>(padded) / static_cast<double>(tokens) : 0.0; }
};

void print_failure(long step, const spg::graphs::RunResult& r) {
  std::fprintf(stderr, "serve_loop: step %ld %s failed: %s (%s)", step, r.bad_chunk >= 0 ? "launch" : "chunk",
               spg::graphs::run_status_name(r.status), cudaGetErrorName(r.cuda));
  if (r.status == spg::graphs::RunStatus::bad_chunk) {
    if (r.bad_chunk >= 0) std::fprintf(stderr, ": chunk %d", r.bad_chunk);
    std::fprintf(stderr, ": request %d, %s: %s", r.bad_request, r.bad_field != nullptr ? r.bad_field : "?",
                 r.bad_reason != nullptr ? r.bad_reason : "?");
  }
  std::fprintf(stderr, "\n");
}

/// Everything the report prints, gathered after the loop.
struct Report {
  const Options& opt;
  const LoopStats& stats;
  const spg::graphs::WarmupReport& warm;
  std::uint64_t host_waits{0};
  std::uint64_t flat_steps{0};  // steps launched as a flat step graph (--flat-steps)
  const spg::memory::AllocationCounter* counter{nullptr};  // null: allocations not counted
  std::uint64_t allocations{0};
  spg::kernels::RunFaults faults{};
  std::uint64_t checksum{0};
  int verified_passed{0};
  int verified_failed{0};
  int verified_chunks{0};
};

void print_report(const Report& r) {
  using namespace spg;
  const Options& opt = r.opt;
  const LoopStats& st = r.stats;
  const graphs::WarmupReport& warm = r.warm;
  std::printf("\n== serve_loop report (%s mode) ==\n", opt.eager ? "eager" : "graph");
  std::printf("  steps                      %ld (%lld chunks, %lld requests finished)\n", opt.steps, st.chunks, st.finished);
  std::printf("  prompt tokens              %lld in %.2f s: %.0f tokens/s\n", st.tokens, st.wall_s, st.tokens_per_s());
  std::printf("  host time per %s launch p50 %.2f us, p99 %.2f us (executor run(), waits excluded)\n",
              opt.one_launch ? "step" : "chunk", percentile(st.host_us, 0.5), percentile(st.host_us, 0.99));
  std::printf("  host time per step         p50 %.2f us, p99 %.2f us (scheduler + model front + launches,\n"
              "                             waits for the device included)\n",
              percentile(st.step_host_us, 0.5), percentile(st.step_host_us, 0.99));
  std::printf("  host waits for the device  %llu of %lld launches, %.2f s in all (the GPU is the bottleneck)\n",
              static_cast<unsigned long long>(r.host_waits), st.launches, st.waited_us / 1e6);
  std::printf("  GPU time per %s          p50 %.1f us, p99 %.1f us\n", opt.one_launch ? "step " : "chunk",
              percentile(st.gpu_us, 0.5), percentile(st.gpu_us, 0.99));
  std::printf("  graph hits / eager runs    %lld / %lld\n", st.graph_hits, st.eager_runs);
  if (opt.flat_steps > 0) {
    std::printf("  flat steps                 %llu of %lld launches (--flat-steps %d%s)\n",
                static_cast<unsigned long long>(r.flat_steps), st.launches, opt.flat_steps,
                opt.flat_pad ? ", --flat-pad" : "");
  }
  std::printf("  padding waste              %.2f%% (%lld padded / %lld real tokens)\n", 100 * st.waste(), st.padded, st.tokens);
  if (r.counter != nullptr) {
    std::printf("  CUDA allocation calls      %llu after warm-up (CUPTI, %d callbacks watched; host times include\n"
                "                             CUPTI's cost: --no-alloc-count for clean ones)\n",
                static_cast<unsigned long long>(r.allocations), r.counter->watched_callbacks());
  } else {
    std::printf("  CUDA allocation calls      not counted (--no-alloc-count)\n");
  }
  std::printf("  pool                       %.2f GiB device, %.1f KiB pinned; graphs %.1f MiB; capture %.1f ms\n",
              static_cast<double>(warm.pool_device_bytes) / (1 << 30), static_cast<double>(warm.pool_pinned_bytes) / 1024,
              static_cast<double>(warm.graph_device_bytes) / (1 << 20), warm.capture_ms);
  const kernels::RunFaults& faults = r.faults;
  std::printf("  device faults (whole run)  %llu in %llu steps", static_cast<unsigned long long>(faults.total()),
              static_cast<unsigned long long>(faults.faulty_steps));
  if (faults.total() > 0) {
    std::printf(" (");
    for (int k = 0; k < kernels::kFaultKinds; ++k) {
      std::printf("%s%s %llu", k ? ", " : "", kernels::fault_name(static_cast<kernels::Fault>(k)),
                  static_cast<unsigned long long>(faults.counts[k]));
    }
    std::printf("; first: %s, request %d, position %d, value %d)%s",
                kernels::fault_name(static_cast<kernels::Fault>(faults.first.kind)), faults.first.request,
                faults.first.position, faults.first.value, opt.allow_faults ? " (--allow-faults)" : "");
  }
  std::printf("\n");
  if (opt.checksum) std::printf("  output checksum            %016llx\n", static_cast<unsigned long long>(r.checksum));
  if (opt.verify > 0 && opt.one_launch) {
    std::printf("  verified steps             %d passed, %d failed (%d chunks)\n", r.verified_passed, r.verified_failed,
                r.verified_chunks);
  } else if (opt.verify > 0) {
    std::printf("  verified chunks            %d passed, %d failed\n", r.verified_passed, r.verified_failed);
  }
}

void write_json(const Report& r) {
  const Options& opt = r.opt;
  const LoopStats& st = r.stats;
  spg::bench::Reporter rep;
  // Runs without the allocation counter are the ones whose host times are clean (no CUPTI).
  const std::string name = r.counter != nullptr ? "serve_loop/default" : "serve_loop/no-cupti";
  const std::string variant =
      std::string(opt.eager ? "spgraph-eager" : "spgraph-graph") + (opt.engine_buffers ? "-engine-buffers" : "") +
      (opt.one_launch ? "-one-launch" : "") + (opt.flat_steps > 0 ? (opt.flat_pad ? "-flat-pad" : "-flat") : "");
  auto add = [&](const char* metric, double v) { rep.add({"executor", name, variant, metric, v}); };
  add("steps", static_cast<double>(opt.steps));
  add("tokens_per_s", st.tokens_per_s());
  add("host_us_p50", percentile(st.host_us, 0.5));
  add("host_us_p99", percentile(st.host_us, 0.99));
  add("step_host_us_p50", percentile(st.step_host_us, 0.5));
  add("step_host_us_p99", percentile(st.step_host_us, 0.99));
  add("host_waits", static_cast<double>(r.host_waits));
  add("gpu_us_p50", percentile(st.gpu_us, 0.5));
  add("gpu_us_p99", percentile(st.gpu_us, 0.99));
  add("graph_hits", static_cast<double>(st.graph_hits));
  if (opt.flat_steps > 0) add("flat_steps", static_cast<double>(r.flat_steps));
  add("eager_runs", static_cast<double>(st.eager_runs));
  add("padding_waste", st.waste());
  if (r.counter != nullptr) add("alloc_calls", static_cast<double>(r.allocations));
  add("capture_ms", r.warm.capture_ms);
  add("graph_mib", static_cast<double>(r.warm.graph_device_bytes) / (1 << 20));
  add("pool_gib", static_cast<double>(r.warm.pool_device_bytes) / (1 << 30));
  if (opt.verify > 0) add("verify_failed", r.verified_failed);
  add("device_faults", static_cast<double>(r.faults.total()));
  const char* commit = std::getenv("SPGRAPH_COMMIT");
  rep.write_json(opt.json, commit != nullptr ? commit : "unknown", today());
}

/// The serving loop around the executor: per scheduler step, the model front writes each chunk's
/// inputs and the executor runs the chunk (one graph launch), timed and optionally checksummed
/// and verified; with --one-launch the executor runs the whole step in one launch instead (the
/// checksum then covers the step's rows, and --verify checks whole steps, chunk by chunk).
class ServeLoop {
 public:
  ServeLoop(const Options& opt, spg::graphs::Executor& ex)
      : opt_(opt),
        ex_(ex),
        sched_(ex.config(), scheduler_config(opt)),
        prompts_(opt),
        verifier_(ex, opt.seed),
        front_layers_(spg::samples::front_layers(ex)),  // view lookups once, not per step
        verify_every_(opt.verify > 0 ? std::max<long>(1, opt.steps / opt.verify) : 0) {
    std::printf("workload: %s\n", prompts_.describe().c_str());
  }

  /// Runs opt.steps scheduler steps and waits for the device. False (after a message) when a
  /// chunk failed.
  bool run(spg::memory::AllocationCounter* counter) {
    Progress progress(opt_.steps, opt_.progress);
    if (counter != nullptr) counter->reset();
    const auto t_start = std::chrono::steady_clock::now();
    for (long step = 0; step < opt_.steps; ++step) {
      const auto s0 = std::chrono::steady_clock::now();
      prompts_.refill(sched_);
      const spg::scheduler::StepPlan plan = sched_.schedule();
      stats_.finished += static_cast<long long>(plan.finished.size());
      if (opt_.one_launch) {
        if (!plan.chunks.empty() && !serve_step(step, plan)) return false;
      } else {
        for (const spg::scheduler::ChunkPlan& cp : plan.chunks) {
          if (!serve_chunk(step, cp)) return false;
        }
      }
      stats_.step_host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s0).count());
      progress.update(step + 1);
    }
    ex_.synchronize();
    stats_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    stats_.gpu_us = gpu_.finish(stats_.launches);
    return true;
  }

  [[nodiscard]] const LoopStats& stats() const noexcept { return stats_; }
  [[nodiscard]] const spg::samples::Verifier& verifier() const noexcept { return verifier_; }
  [[nodiscard]] std::uint64_t checksum() const { return checksum_.read(); }

 private:
  static spg::scheduler::SchedulerConfig scheduler_config(const Options& o) {
    spg::scheduler::SchedulerConfig sc;
    sc.max_num_batched_tokens = o.budget;
    // A chunk holds at most R requests: capping the chunks caps a step's requests at max_step_requests.
    if (o.one_launch) sc.max_chunks_per_step = std::max(1, o.step_requests / o.max_requests);
    return sc;
  }

  /// After one run() call (a chunk or a whole step): false (after a message) when it failed; else
  /// its GPU time's stop event and its host time.
  bool account_launch(long step, const spg::graphs::RunResult& r, std::chrono::steady_clock::time_point h0,
                      std::chrono::steady_clock::time_point h1) {
    if (!r.ok()) {
      print_failure(step, r);
      return false;
    }
    gpu_.stop(stats_.launches, ex_.stream());
    // Host work only: a wait for the device to free a staging block is the device's time.
    stats_.host_us.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() - r.waited_us);
    stats_.waited_us += r.waited_us;
    return true;
  }

  /// One chunk: the model front, the executor's step, the bookkeeping.
  bool serve_chunk(long step, const spg::scheduler::ChunkPlan& cp) {
    using namespace spg;
    const graphs::ChunkInput& input = cp.input(!opt_.derive_slots);
    const kernels::SyntheticFrontArgs front =
        samples::make_front_args(front_layers_, cp, opt_.seed, static_cast<std::uint64_t>(stats_.chunks));
    const bool verify_this = verify_every_ > 0 && step % verify_every_ == 0 &&
                             static_cast<int>(verified_.size()) < opt_.verify && cp.num_tokens > 0;
    if (verify_this) verifier_.before(cp);
    SPG_CUDA_TRY(kernels::SyntheticFront::run(front, ex_.stream()));
    gpu_.start(stats_.launches, ex_.stream());
    const auto h0 = std::chrono::steady_clock::now();
    graphs::RunResult r = opt_.eager ? ex_.run_eager(input) : ex_.run(input);
    const auto h1 = std::chrono::steady_clock::now();
    if (r.status == graphs::RunStatus::no_bucket && !opt_.eager) {
      r = ex_.run_eager(input);  // never expected: the largest bucket is the chunk limit
      ++stats_.eager_runs;
    } else if (!opt_.eager) {
      ++stats_.graph_hits;
    } else {
      ++stats_.eager_runs;
    }
    if (!account_launch(step, r, h0, h1)) return false;
    stats_.padded += ex_.buckets().t_of(r.bucket) - cp.num_tokens;
    stats_.tokens += cp.num_tokens;
    if (opt_.checksum) checksum_.add(ex_, ex_.buckets().t_of(r.bucket), stats_.chunks);
    if (verify_this) {
      verifier_.after(cp, r.bucket, static_cast<std::uint64_t>(stats_.chunks));
      verified_.push_back(static_cast<int>(step));
    }
    ++stats_.chunks;
    ++stats_.launches;
    return true;
  }

  /// A whole step in one run(): one model front for the step's rows (each chunk reads its own).
  bool serve_step(long step, const spg::scheduler::StepPlan& plan) {
    using namespace spg;
    const bool verify_this = verify_every_ > 0 && step % verify_every_ == 0 && static_cast<int>(verified_.size()) < opt_.verify;
    if (verify_this) verifier_.before(plan);
    const graphs::StepInput& input = plan.input();
    SPG_CUDA_TRY(kernels::SyntheticFront::run(
        samples::make_step_front_args(front_layers_, plan, opt_.seed, static_cast<std::uint64_t>(stats_.launches)),
        ex_.stream()));
    gpu_.start(stats_.launches, ex_.stream());
    const auto h0 = std::chrono::steady_clock::now();
    const graphs::RunResult r = opt_.eager ? ex_.run_eager(input) : ex_.run(input);
    const auto h1 = std::chrono::steady_clock::now();
    if (!account_launch(step, r, h0, h1)) return false;
    ++(opt_.eager ? stats_.eager_runs : stats_.graph_hits);
    for (const scheduler::ChunkPlan& cp : plan.chunks) {
      stats_.padded += ex_.buckets().t_of(ex_.buckets().lookup(cp.num_requests, cp.num_tokens)) - cp.num_tokens;
      stats_.tokens += cp.num_tokens;
    }
    // The step's chunks wrote rows [0, step tokens), contiguous; rows past them are not written.
    if (opt_.checksum) checksum_.add(ex_, plan.num_tokens(), stats_.launches);
    if (verify_this) {
      verifier_.after(plan, static_cast<std::uint64_t>(stats_.launches));
      verified_.push_back(static_cast<int>(step));
    }
    stats_.chunks += r.chunks;
    ++stats_.launches;
    return true;
  }

  const Options& opt_;
  spg::graphs::Executor& ex_;
  spg::scheduler::PrefillScheduler sched_;
  PromptStream prompts_;
  spg::samples::Verifier verifier_;
  spg::kernels::SyntheticFrontArgs front_layers_;
  OutputChecksum checksum_;
  GpuTimes gpu_;
  long verify_every_;
  std::vector<int> verified_;  // per verified chunk (per verified step with --one-launch), its step
  LoopStats stats_;
};

int run(const Options& opt) {
  using namespace spg;
  const model::PipelineConfig config = make_config(opt);
  // The counter's CUPTI subscriber costs every cudaGraphLaunch ~0.2 us a node, so host times are
  // only representative with --no-alloc-count.
  memory::AllocationCounter* counter = opt.count_allocations ? &memory::AllocationCounter::instance() : nullptr;
  std::printf("serve_loop: %s mode, %ld steps, budget %d tokens/step, chunks of <= %d requests x %d tokens%s%s\n",
              opt.eager ? "eager" : "graph", opt.steps, opt.budget, config.max_requests, config.max_tokens,
              opt.engine_buffers ? ", engine-owned buffers" : "", opt.one_launch ? ", one launch per step" : "");

  // 1. The executor: bind the engine's buffers (or let the pool hold everything), then warm up.
  graphs::ExecutorOptions eo;
  std::unique_ptr<samples::EngineBuffers> engine;
  if (opt.one_launch) {  // each scheduler step through run(StepInput): one launch a step
    eo.max_step_requests = opt.step_requests;
    eo.max_step_tokens = opt.budget;
    eo.flat_step_chunks = opt.flat_steps;
    eo.flat_step_pad = opt.flat_pad;
  }
  if (opt.engine_buffers) {  // a step's rows, with --one-launch
    engine = std::make_unique<samples::EngineBuffers>(config, eo.insert,
                                                      graphs::StepBounds{eo.max_step_requests, eo.max_step_tokens});
    eo.buffers = engine->bindings();
  }
  graphs::Executor ex(config, eo);
  const graphs::WarmupReport warm = ex.warmup();
  const std::string step_graphs =
      warm.step_graphs > 0 ? " + " + std::to_string(warm.step_graphs) + " step graphs + " +
                                 std::to_string(warm.one_chunk_step_graphs) + " one-chunk step graphs"
                           : std::string();
  std::printf("warm-up: %d graphs (%d shapes x 2 staging blocks)%s captured in %.1f ms; graphs hold %.1f MiB, pool "
              "%.2f GiB device + %.1f KiB pinned in %d allocations%s\n",
              warm.graphs, warm.buckets, step_graphs.c_str(), warm.capture_ms, static_cast<double>(warm.graph_device_bytes) / (1 << 20),
              static_cast<double>(warm.pool_device_bytes) / (1 << 30), static_cast<double>(warm.pool_pinned_bytes) / 1024,
              warm.pool_allocation_calls,
              engine ? (", engine buffers " + memory::format_bytes(engine->bytes())).c_str() : "");
  fill_model_front(ex, opt.seed);

  // 2. The loop: scheduler steps, each chunk one executor run (each step one, with --one-launch).
  ServeLoop loop(opt, ex);
  if (!loop.run(counter)) return 1;

  // 3. The report: what the run measured, and whether it kept its promises.
  Report report{opt, loop.stats(), warm};
  report.host_waits = ex.host_waits();
  report.flat_steps = ex.flat_steps();
  report.counter = counter;
  report.allocations = counter != nullptr ? counter->count() : 0;
  report.faults = ex.read_run_faults();
  if (opt.checksum) report.checksum = loop.checksum();
  report.verified_passed = loop.verifier().passed();
  report.verified_failed = loop.verifier().failed();
  report.verified_chunks = loop.verifier().chunks_checked();
  print_report(report);
  if (!opt.json.empty()) write_json(report);
  if (report.faults.total() > 0 && !opt.allow_faults) {
    std::fprintf(stderr, "serve_loop: the device counted %llu faults over the run (--allow-faults to accept them)\n",
                 static_cast<unsigned long long>(report.faults.total()));
  }
  const bool ok = report.allocations == 0 && report.verified_failed == 0 && (report.faults.total() == 0 || opt.allow_faults);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const spg::samples::ParsedCommandLine cl =
      spg::samples::parse_serve_loop_options(std::vector<std::string>(argv + (argc > 0 ? 1 : 0), argv + argc));
  if (cl.help) {
    std::fputs(spg::samples::serve_loop_help().c_str(), stdout);
    return 0;
  }
  if (!cl.error.empty()) {
    std::fprintf(stderr, "serve_loop: %s (see --help)\n", cl.error.c_str());
    return 2;
  }
  const Options& opt = cl.options;
  try {
    const spg::model::PipelineConfig config = make_config(opt);
    config.validate();
    if (opt.plan_only) {
      print_plan(config, opt);
      return 0;
    }
    if (!spg::core::cuda_device_available()) {
      if (opt.require_gpu) {
        std::printf("serve_loop: no CUDA device found; skipping (exit code 77)\n");
        return 77;
      }
      std::printf("serve_loop: no CUDA device found; running the CPU-side planner instead.\n\n");
      print_plan(config, opt);
      return 0;
    }
    return run(opt);
  } catch (const spg::InvalidArgument& e) {
    std::fprintf(stderr, "serve_loop: invalid configuration: %s\n", e.what());
    return 2;
  } catch (const spg::Error& e) {
    std::fprintf(stderr, "serve_loop: %s\n", e.what());
    return 1;
  }
}
