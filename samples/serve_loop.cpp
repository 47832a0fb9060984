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
#include <span>
#include <string>
#include <vector>

#include "graphs/executor.hpp"
#include "kernels/checksum/checksum.hpp"
#include "kernels/synthetic_front/synthetic_front.hpp"
#include "memory/allocation_counter.hpp"
#include "memory/error.hpp"
#include "memory/pipeline_config.hpp"
#include "graphs/pipeline_pool.hpp"
#include "memory/resources.hpp"
#include "samples/bench/report.hpp"
#include "samples/engine_buffers.hpp"
#include "samples/serve_loop_options.hpp"
#include "samples/serve_loop_verify.hpp"
#include "scheduler/prefill_scheduler.hpp"
#include "scheduler/workload.hpp"

namespace {

using Options = spg::samples::ServeLoopOptions;

spg::memory::PipelineConfig make_config(const Options& o) {
  spg::memory::PipelineConfig c = spg::memory::PipelineConfig::v4_default();
  c.max_requests = o.max_requests;
  c.max_tokens = o.max_tokens;
  c.max_model_len = o.max_model_len;
  c.cache.swa_blocks = 2 * c.max_requests * c.swa_blocks_per_request();
  c.cache.compressed_blocks = 2 * c.max_requests * c.compressed_blocks_per_request();
  return c;
}

void print_plan(const spg::memory::PipelineConfig& config, const Options& opt) {
  const bool engine_buffers = opt.engine_buffers;
  // With --engine-buffers the model front owns every layer buffer: the pool plans only its own.
  auto plan = spg::graphs::plan_pipeline_pool(
      config, [&](std::size_t, spg::graphs::LayerBuffer) { return engine_buffers; }, true);
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

int run(const Options& opt) {
  using namespace spg;
  const memory::PipelineConfig config = make_config(opt);
  // The counter's CUPTI subscriber costs every cudaGraphLaunch ~0.2 us a node, so host times are
  // only representative with --no-alloc-count.
  memory::AllocationCounter* counter = opt.count_allocations ? &memory::AllocationCounter::instance() : nullptr;

  std::printf("serve_loop: %s mode, %ld steps, budget %d tokens/step, chunks of <= %d requests x %d tokens%s%s\n",
              opt.eager ? "eager" : "graph", opt.steps, opt.budget, config.max_requests, config.max_tokens,
              opt.engine_buffers ? ", engine-owned buffers" : "", opt.one_launch ? ", one launch per step" : "");
  graphs::ExecutorOptions eo;
  std::unique_ptr<samples::EngineBuffers> engine;
  if (opt.engine_buffers) {
    engine = std::make_unique<samples::EngineBuffers>(config, eo.insert);
    eo.buffers = engine->bindings();
  }
  if (opt.one_launch) {  // each scheduler step through run(StepInput): one launch a step
    eo.max_step_requests = opt.step_requests;
    eo.max_step_tokens = opt.budget;
  }
  graphs::Executor ex(config, eo);
  const graphs::WarmupReport warm = ex.warmup();
  std::printf("warm-up: %d graphs (%d shapes x 2 staging blocks) captured in %.1f ms; graphs hold %.1f MiB, pool %.2f GiB "
              "device + %.1f KiB pinned in %d allocations%s\n",
              warm.graphs, warm.buckets, warm.capture_ms, static_cast<double>(warm.graph_device_bytes) / (1 << 20),
              static_cast<double>(warm.pool_device_bytes) / (1 << 30), static_cast<double>(warm.pool_pinned_bytes) / 1024,
              warm.pool_allocation_calls,
              engine ? (", engine buffers " + memory::format_bytes(engine->bytes())).c_str() : "");

  // The model front's fixed part: query rows (random, once) and the sinks.
  for (std::size_t l = 0; l < config.layers.size(); ++l) {
    const auto& layer = config.layers[l];
    const graphs::LayerBuffers& v = ex.layer(l);
    const std::size_t elems = std::size_t{1} * config.max_tokens * layer.h_q * layer.d_qk;
    SPG_EXPECTS(v.q.stride(0) == static_cast<std::size_t>(layer.h_q) * layer.d_qk &&
                    v.out.stride(0) == static_cast<std::size_t>(layer.h_q) * layer.d_v,
                "serve_loop fills q and checksums out as contiguous [T, h_q, d] tensors");
    SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(v.q.data_handle(), elems, opt.seed, static_cast<int>(l), ex.stream()));
    if (layer.attn_sink) {
      std::vector<float> sink(static_cast<std::size_t>(layer.h_q));
      for (std::size_t h = 0; h < sink.size(); ++h) {
        sink[h] = 4.0F * kernels::front_q_value(opt.seed + 7, static_cast<int>(l), h);
      }
      SPG_CUDA_TRY(cudaMemcpy(v.attn_sink.data_handle(), sink.data(), sink.size() * 4, cudaMemcpyHostToDevice));
    }
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // the sinks were copied on the legacy stream

  scheduler::SchedulerConfig sc;
  sc.max_num_batched_tokens = opt.budget;
  // A chunk holds at most R requests: capping the chunks caps a step's requests at max_step_requests.
  if (opt.one_launch) sc.max_chunks_per_step = std::max(1, opt.step_requests / config.max_requests);
  scheduler::PrefillScheduler sched(config, sc);
  scheduler::WorkloadConfig wc;
  wc.num_requests = opt.requests;
  wc.min_prompt_len = opt.min_len;
  wc.max_prompt_len = opt.max_len;
  wc.lengths = opt.lengths;
  wc.arrivals = opt.arrivals;
  wc.arrival_rate = opt.rate;
  std::printf("workload: %s\n", wc.describe().c_str());

  samples::Verifier verifier(ex, opt.seed);
  const kernels::SyntheticFrontArgs front_layers = samples::front_layers(ex);  // view lookups once, not per step
  memory::DeviceBuffer checksum(sizeof(std::uint64_t));
  SPG_CUDA_TRY(cudaMemset(checksum.data(), 0, sizeof(std::uint64_t)));
  constexpr int kRing = 64;  // GPU-time events: read back 64 chunks later, never waited on early
  std::vector<memory::Event> ev_start;
  std::vector<memory::Event> ev_stop;
  for (int i = 0; i < kRing; ++i) {
    ev_start.emplace_back();
    ev_stop.emplace_back();
  }
  std::vector<double> host_us;
  std::vector<double> step_host_us;
  std::vector<double> gpu_us;
  std::vector<int> verify_at;
  long long chunks = 0;
  long long launches = 0;  // run() calls: one per chunk, or one per step with --one-launch
  long long tokens = 0;
  long long padded = 0;
  long long graph_hits = 0;
  long long eager_runs = 0;
  long long finished = 0;
  double waited_us = 0;
  std::int64_t next_id = 0;
  int batch = 0;
  const long verify_every = opt.verify > 0 ? std::max<long>(1, opt.steps / opt.verify) : 0;
  Progress progress(opt.steps, opt.progress);

  if (counter != nullptr) counter->reset();
  const auto t_start = std::chrono::steady_clock::now();
  for (long step = 0; step < opt.steps; ++step) {
    const auto s0 = std::chrono::steady_clock::now();
    if (sched.done()) {
      wc.seed = opt.seed * 1000003ULL + static_cast<std::uint64_t>(batch++);
      wc.first_step = sched.next_step();
      auto reqs = scheduler::make_workload(wc);
      for (auto& r : reqs) r.id = next_id++;
      sched.submit(reqs);
    }
    const scheduler::StepPlan plan = sched.schedule();
    finished += static_cast<long long>(plan.finished.size());
    if (opt.one_launch && !plan.chunks.empty()) {
      // The whole step in one run(): one model front for all its chunks (they share the rows).
      const graphs::StepInput& input = plan.input();
      SPG_CUDA_TRY(kernels::SyntheticFront::run(
          samples::make_step_front_args(front_layers, plan, opt.seed, static_cast<std::uint64_t>(launches)),
          ex.stream()));
      const int slot = static_cast<int>(launches % kRing);
      if (launches >= kRing) {
        ev_stop[static_cast<std::size_t>(slot)].synchronize();
        gpu_us.push_back(1000.0 * ev_stop[static_cast<std::size_t>(slot)].elapsed_ms_since(ev_start[static_cast<std::size_t>(slot)]));
      }
      ev_start[static_cast<std::size_t>(slot)].record(ex.stream());
      const auto h0 = std::chrono::steady_clock::now();
      const graphs::RunResult r = opt.eager ? ex.run_eager(input) : ex.run(input);
      const auto h1 = std::chrono::steady_clock::now();
      if (!r.ok()) {
        std::fprintf(stderr, "serve_loop: step %ld failed: %s (%s), chunk %d, request %d, %s: %s\n", step,
                     graphs::run_status_name(r.status), cudaGetErrorName(r.cuda), r.bad_chunk, r.bad_request,
                     r.bad_field != nullptr ? r.bad_field : "-", r.bad_reason != nullptr ? r.bad_reason : "-");
        return 1;
      }
      ev_stop[static_cast<std::size_t>(slot)].record(ex.stream());
      host_us.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() - r.waited_us);
      waited_us += r.waited_us;
      (opt.eager ? eager_runs : graph_hits) += 1;
      for (const scheduler::ChunkPlan& cp : plan.chunks) {
        padded += ex.buckets().t_of(ex.buckets().lookup(cp.num_requests, cp.num_tokens)) - cp.num_tokens;
        tokens += cp.num_tokens;
      }
      chunks += r.chunks;
      ++launches;
    }
    for (const scheduler::ChunkPlan& cp : opt.one_launch ? std::span<const scheduler::ChunkPlan>{}
                                                         : std::span<const scheduler::ChunkPlan>(plan.chunks)) {
      const graphs::ChunkInput& input = cp.input(!opt.derive_slots);
      const kernels::SyntheticFrontArgs front =
          samples::make_front_args(front_layers, cp, opt.seed, static_cast<std::uint64_t>(chunks));
      const bool verify_this = verify_every > 0 && step % verify_every == 0 &&
                               static_cast<int>(verify_at.size()) < opt.verify && cp.num_tokens > 0;
      if (verify_this) verifier.before(cp);
      SPG_CUDA_TRY(kernels::SyntheticFront::run(front, ex.stream()));
      const int slot = static_cast<int>(launches % kRing);
      if (launches >= kRing) {
        ev_stop[static_cast<std::size_t>(slot)].synchronize();
        gpu_us.push_back(1000.0 * ev_stop[static_cast<std::size_t>(slot)].elapsed_ms_since(ev_start[static_cast<std::size_t>(slot)]));
      }
      ev_start[static_cast<std::size_t>(slot)].record(ex.stream());
      const auto h0 = std::chrono::steady_clock::now();
      graphs::RunResult r = opt.eager ? ex.run_eager(input) : ex.run(input);
      const auto h1 = std::chrono::steady_clock::now();
      if (r.status == graphs::RunStatus::no_bucket && !opt.eager) {
        r = ex.run_eager(input);  // never expected: the largest bucket is the chunk limit
        ++eager_runs;
      } else if (!opt.eager) {
        ++graph_hits;
      } else {
        ++eager_runs;
      }
      if (!r.ok()) {
        std::fprintf(stderr, "serve_loop: step %ld chunk failed: %s (%s)", step, graphs::run_status_name(r.status),
                     cudaGetErrorName(r.cuda));
        if (r.status == graphs::RunStatus::bad_chunk) {
          std::fprintf(stderr, ": request %d, %s: %s", r.bad_request, r.bad_field != nullptr ? r.bad_field : "?",
                       r.bad_reason != nullptr ? r.bad_reason : "?");
        }
        std::fprintf(stderr, "\n");
        return 1;
      }
      ev_stop[static_cast<std::size_t>(slot)].record(ex.stream());
      // Host work only: a wait for the device to free a staging block is the device's time.
      host_us.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() - r.waited_us);
      waited_us += r.waited_us;
      padded += ex.buckets().t_of(r.bucket) - cp.num_tokens;
      tokens += cp.num_tokens;
      if (opt.checksum) {
        const int t_bucket = ex.buckets().t_of(r.bucket);
        for (std::size_t l = 0; l < config.layers.size(); ++l) {
          const auto& layer = config.layers[l];
          const graphs::LayerBuffers& v = ex.layer(l);
          const std::size_t rows = std::size_t{1} * t_bucket * layer.h_q;
          auto* acc = static_cast<std::uint64_t*>(checksum.data());
          const auto salt = static_cast<std::uint64_t>(chunks) << 32 | l << 8;
          SPG_CUDA_TRY(kernels::Checksum::accumulate(v.out.data_handle(), rows * 1024, salt, acc, ex.stream()));
          SPG_CUDA_TRY(kernels::Checksum::accumulate(v.lse.data_handle(), rows * 4, salt + 1, acc, ex.stream()));
          SPG_CUDA_TRY(kernels::Checksum::accumulate(v.max_logits.data_handle(), rows * 4, salt + 2, acc, ex.stream()));
        }
      }
      if (verify_this) {
        verifier.after(cp, r.bucket, static_cast<std::uint64_t>(chunks));
        verify_at.push_back(static_cast<int>(step));
      }
      ++chunks;
      ++launches;
    }
    step_host_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s0).count());
    progress.update(step + 1);
  }
  ex.synchronize();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  for (long long c = std::max<long long>(0, launches - kRing); c < launches; ++c) {
    const auto slot = static_cast<std::size_t>(c % kRing);
    gpu_us.push_back(1000.0 * ev_stop[slot].elapsed_ms_since(ev_start[slot]));
  }
  const std::uint64_t allocations = counter != nullptr ? counter->count() : 0;
  const kernels::RunFaults faults = ex.read_run_faults();

  const double tokens_per_s = static_cast<double>(tokens) / wall_s;
  const double waste = tokens > 0 ? static_cast<double>(padded) / static_cast<double>(tokens) : 0.0;
  std::printf("\n== serve_loop report (%s mode) ==\n", opt.eager ? "eager" : "graph");
  std::printf("  steps                      %ld (%lld chunks, %lld requests finished)\n", opt.steps, chunks, finished);
  std::printf("  prompt tokens              %lld in %.2f s: %.0f tokens/s\n", tokens, wall_s, tokens_per_s);
  std::printf("  host time per %s launch p50 %.2f us, p99 %.2f us (executor run(), waits excluded)\n",
              opt.one_launch ? "step" : "chunk", percentile(host_us, 0.5), percentile(host_us, 0.99));
  std::printf("  host time per step         p50 %.2f us, p99 %.2f us (scheduler + model front + launches,\n"
              "                             waits for the device included)\n",
              percentile(step_host_us, 0.5), percentile(step_host_us, 0.99));
  std::printf("  host waits for the device  %llu of %lld launches, %.2f s in all (the GPU is the bottleneck)\n",
              static_cast<unsigned long long>(ex.host_waits()), launches, waited_us / 1e6);
  std::printf(opt.one_launch ? "  GPU time per step          p50 %.1f us, p99 %.1f us\n" : "  GPU time per chunk         p50 %.1f us, p99 %.1f us\n", percentile(gpu_us, 0.5), percentile(gpu_us, 0.99));
  std::printf("  graph hits / eager runs    %lld / %lld\n", graph_hits, eager_runs);
  std::printf("  padding waste              %.2f%% (%lld padded / %lld real tokens)\n", 100 * waste, padded, tokens);
  if (counter != nullptr) {
    std::printf("  CUDA allocation calls      %llu after warm-up (CUPTI, %d callbacks watched; host times include\n"
                "                             CUPTI's cost: --no-alloc-count for clean ones)\n",
                static_cast<unsigned long long>(allocations), counter->watched_callbacks());
  } else {
    std::printf("  CUDA allocation calls      not counted (--no-alloc-count)\n");
  }
  std::printf("  pool                       %.2f GiB device, %.1f KiB pinned; graphs %.1f MiB; capture %.1f ms\n",
              static_cast<double>(warm.pool_device_bytes) / (1 << 30), static_cast<double>(warm.pool_pinned_bytes) / 1024,
              static_cast<double>(warm.graph_device_bytes) / (1 << 20), warm.capture_ms);
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
  if (opt.checksum) {
    std::uint64_t sum = 0;
    SPG_CUDA_TRY(cudaMemcpy(&sum, checksum.data(), sizeof sum, cudaMemcpyDeviceToHost));
    std::printf("  output checksum            %016llx\n", static_cast<unsigned long long>(sum));
  }
  if (opt.verify > 0) {
    std::printf("  verified chunks            %d passed, %d failed\n", verifier.passed(), verifier.failed());
  }

  if (!opt.json.empty()) {
    bench::Reporter rep;
    // Runs without the allocation counter are the ones whose host times are clean (no CUPTI).
    const std::string name = counter != nullptr ? "serve_loop/default" : "serve_loop/no-cupti";
    const std::string variant =
        std::string(opt.eager ? "spgraph-eager" : "spgraph-graph") + (opt.engine_buffers ? "-engine-buffers" : "") +
        (opt.one_launch ? "-one-launch" : "");
    auto add = [&](const char* metric, double v) { rep.add({"executor", name, variant, metric, v}); };
    add("steps", static_cast<double>(opt.steps));
    add("tokens_per_s", tokens_per_s);
    add("host_us_p50", percentile(host_us, 0.5));
    add("host_us_p99", percentile(host_us, 0.99));
    add("step_host_us_p50", percentile(step_host_us, 0.5));
    add("step_host_us_p99", percentile(step_host_us, 0.99));
    add("host_waits", static_cast<double>(ex.host_waits()));
    add("gpu_us_p50", percentile(gpu_us, 0.5));
    add("gpu_us_p99", percentile(gpu_us, 0.99));
    add("graph_hits", static_cast<double>(graph_hits));
    add("eager_runs", static_cast<double>(eager_runs));
    add("padding_waste", waste);
    if (counter != nullptr) add("alloc_calls", static_cast<double>(allocations));
    add("capture_ms", warm.capture_ms);
    add("graph_mib", static_cast<double>(warm.graph_device_bytes) / (1 << 20));
    add("pool_gib", static_cast<double>(warm.pool_device_bytes) / (1 << 30));
    if (opt.verify > 0) add("verify_failed", verifier.failed());
    add("device_faults", static_cast<double>(faults.total()));
    const char* commit = std::getenv("SPGRAPH_COMMIT");
    rep.write_json(opt.json, commit != nullptr ? commit : "unknown", today());
  }
  if (faults.total() > 0 && !opt.allow_faults) {
    std::fprintf(stderr, "serve_loop: the device counted %llu faults over the run (--allow-faults to accept them)\n",
                 static_cast<unsigned long long>(faults.total()));
  }
  const bool ok = allocations == 0 && verifier.failed() == 0 && (faults.total() == 0 || opt.allow_faults);
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
    const spg::memory::PipelineConfig config = make_config(opt);
    config.validate();
    if (opt.plan_only) {
      print_plan(config, opt);
      return 0;
    }
    if (!spg::memory::cuda_device_available()) {
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
