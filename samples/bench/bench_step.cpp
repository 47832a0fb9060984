// Table D (steps): see bench_step.hpp.
#include "samples/bench/bench_step.hpp"

#include <algorithm>
#include <chrono>
#include <initializer_list>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/kernels/spin/spin.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"
#include "samples/bench/bench_pipeline.hpp"
#include "samples/bench/probes.hpp"
#include "samples/bench/step_inputs.hpp"
#include "samples/serve_loop_verify.hpp"

namespace spg::bench {

namespace {

constexpr int kR = kStepR;
constexpr int kT = kStepT;
constexpr int kQuery = kStepQuery;
constexpr int kPrefix = kStepPrefix;
constexpr int kMaxChunks = kStepMaxChunks;
constexpr int kReps = 200;

void fill_inputs(graphs::Executor& ex) {
  fill_layer_inputs(ex);
  // One front for the largest step's rows (a chunk run alone reads the first kT): every chunk's
  // requests have the same lengths.
  const std::vector<std::int32_t> qsl = {0, kMaxChunks * kT};
  const std::vector<std::int32_t> seq = {kPrefix + kQuery};
  const int new_rows[graphs::kNumRatios] = {0, kMaxChunks * kT / 4, 0};
  SPG_CUDA_TRY(kernels::SyntheticFront::run(samples::make_front_args(samples::front_layers(ex), qsl, seq, new_rows, 3, 0),
                                            ex.stream()));
  SPG_CUDA_TRY(cudaDeviceSynchronize());
}

void require(const graphs::RunResult& r) {
  SPG_EXPECTS_AS(StateError, r.ok(), "bench: step failed: " << graphs::run_status_name(r.status) << " ("
                                                            << (r.bad_field != nullptr ? r.bad_field : "") << ")");
}

/// Adds each (metric, value) of `metrics` to row `row` of the executor suite, as `variant`.
void add_metrics(Reporter& rep, const std::string& row, const char* variant,
                 std::initializer_list<std::pair<const char*, double>> metrics) {
  for (const auto& [metric, value] : metrics) rep.add({"executor", row, variant, metric, value});
}

/// The bench step of `chunks` chunks, made into `step` and run twice so that both step staging
/// blocks hold it (a direct launch of a step exec reads either), the device idle after; its input.
graphs::StepInput stage_in_both_blocks(graphs::Executor& ex, const model::PipelineConfig& config, int chunks,
                                       BenchStep& step) {
  make_step(config, chunks, step);
  const graphs::StepInput in{step.requests};
  require(ex.run(in));
  require(ex.run(in));
  ex.synchronize();
  return in;
}

/// GPU microseconds of `launch` on the executor's stream (events around it, waited for).
template <class Launch>
double gpu_us(graphs::Executor& ex, core::Event& a, core::Event& b, Launch&& launch) {
  a.record(ex.stream());
  launch();
  b.record(ex.stream());
  b.synchronize();
  return 1000.0 * b.elapsed_ms_since(a);
}


/// Node and edge structure of one graph level: node counts by type, edges (programmatic ones
/// apart), the widest fan-out and fan-in (a fork or a join when above 1).
std::string describe_graph(cudaGraph_t g) {
  std::size_t n = 0;
  SPG_CUDA_TRY(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SPG_CUDA_TRY(cudaGraphGetNodes(g, nodes.data(), &n));
  std::map<int, int> types;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    SPG_CUDA_TRY(cudaGraphNodeGetType(node, &t));
    ++types[static_cast<int>(t)];
  }
  std::size_t e = 0;
  SPG_CUDA_TRY(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &e));
  std::vector<cudaGraphNode_t> from(e);
  std::vector<cudaGraphNode_t> to(e);
  std::vector<cudaGraphEdgeData> data(e);
  if (e > 0) SPG_CUDA_TRY(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &e));
  std::map<cudaGraphNode_t, int> out_degree;
  std::map<cudaGraphNode_t, int> in_degree;
  int programmatic = 0;
  for (std::size_t i = 0; i < e; ++i) {
    ++out_degree[from[i]];
    ++in_degree[to[i]];
    programmatic += data[i].type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  }
  int fan_out = 0;
  int fan_in = 0;
  for (const auto& [node, d] : out_degree) fan_out = std::max(fan_out, d);
  for (const auto& [node, d] : in_degree) fan_in = std::max(fan_in, d);
  std::string text = std::to_string(n) + " nodes (";
  for (const auto& [t, count] : types) {
    const char* name = t == cudaGraphNodeTypeKernel        ? "kernel"
                       : t == cudaGraphNodeTypeMemcpy      ? "memcpy"
                       : t == cudaGraphNodeTypeMemset      ? "memset"
                       : t == cudaGraphNodeTypeConditional ? "conditional"
                       : t == cudaGraphNodeTypeEventRecord ? "event-record"
                       : t == cudaGraphNodeTypeWaitEvent   ? "event-wait"
                                                           : "other";
    text += std::to_string(count) + " " + name + ", ";
  }
  text.resize(text.size() - 2);
  text += "), " + std::to_string(e) + " edges (" + std::to_string(programmatic) + " programmatic), fan-out " +
          std::to_string(fan_out) + ", fan-in " + std::to_string(fan_in);
  return text;
}

/// Host time of ex.run(in) and its phases, medians: idle (synchronized after each) and busy (two
/// launches behind a 2 ms spin, which is as far as the staging blocks let the host run ahead).
template <class Input>
void time_runs(graphs::Executor& ex, const Input& in, const std::string& name, const char* variant, Reporter& rep) {
  for (const bool busy : {false, true}) {
    std::vector<double> host;
    std::vector<double> launch;
    std::vector<double> staging;
    std::vector<double> order;
    for (int i = 0; i < 35; ++i) {  // 60 launches after 10
      if (busy) SPG_CUDA_TRY(kernels::launch_spin(2'000'000ULL, ex.stream()));
      for (int j = 0; j < 2; ++j) {
        const auto t0 = std::chrono::steady_clock::now();
        const graphs::RunResult r = ex.run(in);
        const auto t1 = std::chrono::steady_clock::now();
        require(r);
        if (!busy) ex.synchronize();
        if (i < 5) continue;
        host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() - r.waited_us);
        launch.push_back(r.phases.launch_us);
        staging.push_back(r.phases.staging_us);
        order.push_back(r.phases.record_us);
      }
      ex.synchronize();
    }
    const std::string row = name + (busy ? "/busy" : "/idle");
    auto add = [&](const char* metric, double v) { rep.add({"executor", row, variant, metric, v}); };
    add("host_us", median(host));
    add("host_launch_us", median(launch));
    add("host_staging_us", median(staging));
    add("host_record_us", median(order));
    std::printf("  %-34s host %.2f us (staging %.2f, cudaGraphLaunch %.2f, other %.2f)\n", row.c_str(), median(host),
                median(staging), median(launch), median(host) - median(staging) - median(launch));
  }
}

/// The real chunk graph taken apart by kernel: for each distinct kernel of `graph`, a chain of as
/// many copies of one of its nodes as `graph` has kernel nodes (same launch parameters and node
/// attributes), launched onto an idle device after a synchronization and right after another
/// launch of itself. A host on which the real graph's launch costs several times the empty-kernel
/// probes' names here the kernel that carries the cost (issue 18).
void probe_real_kernels(const graphs::Graph& graph, cudaStream_t stream, const std::string& program, Reporter& rep) {
  std::size_t n = 0;
  SPG_CUDA_TRY(cudaGraphGetNodes(graph.get(), nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  SPG_CUDA_TRY(cudaGraphGetNodes(graph.get(), nodes.data(), &n));
  std::vector<cudaGraphNode_t> firsts;  // the first node of each kernel
  std::map<void*, int> uses;
  int kernel_nodes = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    SPG_CUDA_TRY(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams kp{};
    SPG_CUDA_TRY(cudaGraphKernelNodeGetParams(node, &kp));
    ++kernel_nodes;
    if (uses[kp.func]++ == 0) firsts.push_back(node);
  }
  for (cudaGraphNode_t src : firsts) {
    cudaKernelNodeParams kp{};
    SPG_CUDA_TRY(cudaGraphKernelNodeGetParams(src, &kp));
    const char* name = nullptr;
    if (cudaFuncGetName(&name, kp.func) != cudaSuccess || name == nullptr) name = "?";
    cudaGraph_t raw = nullptr;
    SPG_CUDA_TRY(cudaGraphCreate(&raw, 0));
    const graphs::Graph chain(raw);
    cudaGraphNode_t prev = nullptr;
    for (int i = 0; i < kernel_nodes; ++i) {
      cudaGraphNode_t node = nullptr;
      SPG_CUDA_TRY(cudaGraphAddKernelNode(&node, raw, prev != nullptr ? &prev : nullptr, prev != nullptr ? 1 : 0, &kp));
      SPG_CUDA_TRY(cudaGraphKernelNodeCopyAttributes(node, src));
      prev = node;
    }
    const graphs::GraphExec exec = graphs::GraphExec::instantiate(chain, stream);
    std::vector<double> idle;
    std::vector<double> after;
    for (int i = 0; i < 30; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      SPG_CUDA_TRY(exec.launch(stream));
      const auto t1 = std::chrono::steady_clock::now();
      SPG_CUDA_TRY(exec.launch(stream));
      const auto t2 = std::chrono::steady_clock::now();
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      if (i >= 5) {
        idle.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        after.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
      }
    }
    std::string short_name(name);
    if (short_name.size() > 60) short_name = short_name.substr(0, 60);
    const std::string row = "launch-probe/real-kernel/" + program + "/" + short_name;
    rep.add({"executor", row, "graph", "nodes", static_cast<double>(kernel_nodes)});
    rep.add({"executor", row, "graph", "uses_in_graph", static_cast<double>(uses[kp.func])});
    rep.add({"executor", row, "graph", "host_launch_us_idle", median(idle)});
    rep.add({"executor", row, "graph", "host_launch_us_after_launch", median(after)});
    std::printf("  launch-probe real kernel x%d (%d in the graph, grid %u, %u threads, %zu B shared) %s: cudaGraphLaunch idle "
                "%.2f us, right after a launch %.2f us\n",
                kernel_nodes, uses[kp.func], kp.gridDim.x * kp.gridDim.y * kp.gridDim.z, kp.blockDim.x * kp.blockDim.y * kp.blockDim.z,
                static_cast<std::size_t>(kp.sharedMemBytes), short_name.c_str(), median(idle), median(after));
  }
}

/// One step size's figures, medians: host time of run() on an idle device and its phases, and the
/// GPU time of the step, of its chunks run one by one and (with `eager`) of the eager host loop;
/// reported as rows `name` (metrics host_us, host_launch_us, host_staging_us, gpu_us,
/// gpu_us_chunks_one_by_one, gpu_us_eager_loop) and one printed line. Returns how many times it
/// ran the step through run().
int measure_step(graphs::Executor& ex, graphs::StepSplitter& splitter, const graphs::StepInput& in, bool eager,
                  const std::string& name, Reporter& rep) {
  std::vector<double> host;
  std::vector<double> launch;
  std::vector<double> staging;
  for (int i = 0; i < kReps + 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const graphs::RunResult r = ex.run(in);
    const auto t1 = std::chrono::steady_clock::now();
    require(r);
    ex.synchronize();
    if (i < 10) continue;
    host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() - r.waited_us);
    launch.push_back(r.phases.launch_us);
    staging.push_back(r.phases.staging_us);
  }
  core::Event a;
  core::Event b;
  std::vector<double> step_gpu;
  std::vector<double> eager_gpu;
  std::vector<double> chunks_gpu;
  const int k = splitter.split(in).chunks;
  for (int i = 0; i < 21; ++i) {
    step_gpu.push_back(gpu_us(ex, a, b, [&] { require(ex.run(in)); }));
    if (eager) eager_gpu.push_back(gpu_us(ex, a, b, [&] { require(ex.run_eager(in)); }));
    double sum = 0;
    for (int c = 0; c < k; ++c) sum += gpu_us(ex, a, b, [&] { require(ex.run(splitter.chunk(c))); });
    chunks_gpu.push_back(sum);
  }
  auto add = [&](const char* metric, double v) { rep.add({"executor", name, "spgraph-step", metric, v}); };
  add("host_us", median(host));
  add("host_launch_us", median(launch));
  add("host_staging_us", median(staging));
  add("gpu_us", median(step_gpu));
  add("gpu_us_chunks_one_by_one", median(chunks_gpu));
  if (eager) add("gpu_us_eager_loop", median(eager_gpu));
  std::printf("  %-28s host %.2f us (staging %.2f, cudaGraphLaunch %.2f); GPU %.1f us vs %.1f us one by one (%+.1f%%)",
              name.c_str(), median(host), median(staging), median(launch), median(step_gpu), median(chunks_gpu),
              100.0 * (median(step_gpu) / median(chunks_gpu) - 1.0));
  if (eager) std::printf(", %.1f us eager loop", median(eager_gpu));
  std::printf("\n");
  return kReps + 10 + static_cast<int>(step_gpu.size());
}

/// Staged steps (stage once, run per layer), as an engine calls them: per step one stage() and
/// `layers` run_staged() calls, the first of which loads the step and the rest run it again. Host
/// time of stage() and of the first and later run_staged() calls on an idle device (synchronized
/// after each) and queued behind a 2 ms spin (the engine's case: the device is busy with the
/// layers before); GPU time of a staged step run again against run(StepInput) of the same step.
/// Rows `name` (metrics host_stage_us, host_us_first, host_us_rerun, host_launch_us_rerun,
/// host_us_rerun_busy, gpu_us_rerun, gpu_us_run_step).
void measure_staged(graphs::Executor& ex, const graphs::StepInput& in, const std::string& name, Reporter& rep) {
  constexpr int kLayers = 8;
  std::vector<double> stage;
  std::vector<double> first;
  std::vector<double> rerun;
  std::vector<double> rerun_launch;
  std::vector<double> rerun_busy;
  const std::uint64_t reruns_before = ex.staged_reruns();
  int reruns = 0;
  for (int i = 0; i < 60; ++i) {
    const bool busy = i % 2 == 1;
    const auto t0 = std::chrono::steady_clock::now();
    const graphs::RunResult s = ex.stage(in);
    const auto t1 = std::chrono::steady_clock::now();
    require(s);
    if (busy) SPG_CUDA_TRY(kernels::launch_spin(2'000'000ULL, ex.stream()));
    for (int layer = 0; layer < kLayers; ++layer) {
      const auto a0 = std::chrono::steady_clock::now();
      const graphs::RunResult r = ex.run_staged(0);
      const auto a1 = std::chrono::steady_clock::now();
      require(r);
      if (layer > 0) ++reruns;
      if (!busy) ex.synchronize();
      if (i < 10) continue;
      const double us = us_between(a0, a1) - r.waited_us;
      if (busy) {
        if (layer > 0) rerun_busy.push_back(us);
      } else if (layer == 0) {
        first.push_back(us);
      } else {
        rerun.push_back(us);
        rerun_launch.push_back(r.phases.launch_us);
      }
    }
    ex.synchronize();
    if (i >= 10 && !busy) stage.push_back(us_between(t0, t1) - s.waited_us);
  }
  SPG_EXPECTS_AS(StateError, ex.staged_reruns() == reruns_before + static_cast<std::uint64_t>(reruns),
                 "bench: " << name << ": the later run_staged() calls did not run the staged step again");
  core::Event a;
  core::Event b;
  std::vector<double> gpu_rerun;
  std::vector<double> gpu_step;
  require(ex.stage(in));
  require(ex.run_staged(0));
  for (int i = 0; i < 21; ++i) {
    gpu_rerun.push_back(gpu_us(ex, a, b, [&] { require(ex.run_staged(0)); }));
  }
  for (int i = 0; i < 21; ++i) gpu_step.push_back(gpu_us(ex, a, b, [&] { require(ex.run(in)); }));
  add_metrics(rep, name, "spgraph-staged",
              {{"host_stage_us", median(stage)},
               {"host_us_first", median(first)},
               {"host_us_rerun", median(rerun)},
               {"host_launch_us_rerun", median(rerun_launch)},
               {"host_us_rerun_busy", median(rerun_busy)},
               {"gpu_us_rerun", median(gpu_rerun)},
               {"gpu_us_run_step", median(gpu_step)}});
  std::printf("  %-28s stage %.2f us; run_staged host %.2f us first, %.2f us again (cudaGraphLaunch %.2f; queued %.2f); "
              "GPU %.1f us again vs %.1f us run(step) (%+.1f%%)\n",
              name.c_str(), median(stage), median(first), median(rerun), median(rerun_launch), median(rerun_busy),
              median(gpu_rerun), median(gpu_step), 100.0 * (median(gpu_rerun) / median(gpu_step) - 1.0));
}

/// Steps through flat step graphs (ExecutorOptions::flat_step_chunks = kMaxChunks, flat_step_pad):
/// an executor of its own, then per step size the host time of run() (idle device) and the GPU
/// time of the step against its chunks run one by one, and the staged step's figures; all-full
/// steps (rows step-flat/<program>/<k> chunks, staged-flat/...; staged steps of one chunk, full
/// or not, through their bucket's plain graph) and steps whose last chunk is one request (not
/// full: padded to the largest bucket; rows ...<k> chunks, last not full).
void time_flat_steps(const model::PipelineConfig& config, graphs::ExecutorOptions opt, const std::string& program,
                     Reporter& rep) {
  opt.flat_step_chunks = kMaxChunks;
  opt.flat_step_pad = true;
  graphs::Executor ex(config, opt);
  const graphs::WarmupReport w = ex.warmup();
  fill_inputs(ex);
  std::printf("  flat steps, %s program: %d flat step graphs (2 .. %d chunks), capture %.0f ms and %.1f MiB of graphs "
              "(all graphs)\n",
              program.c_str(), w.flat_step_graphs, kMaxChunks, w.capture_ms,
              static_cast<double>(w.graph_device_bytes) / (1 << 20));
  rep.add({"executor", "step-flat/" + program + "/warmup", "spgraph-step", "flat_step_graphs",
           static_cast<double>(w.flat_step_graphs)});
  rep.add({"executor", "step-flat/" + program + "/warmup", "spgraph-step", "capture_ms", w.capture_ms});
  rep.add({"executor", "step-flat/" + program + "/warmup", "spgraph-step", "graph_device_bytes",
           static_cast<double>(w.graph_device_bytes)});
  graphs::StepSplitter splitter(config, ex.step_layout());
  for (const auto& [chunks, last] : {std::pair{1, kR}, std::pair{1, 1}, std::pair{4, kR}, std::pair{16, kR},
                                     std::pair{4, 1}, std::pair{16, 1}}) {
    BenchStep step;
    make_step(config, chunks, step, last);
    const graphs::StepInput in{step.requests};
    const std::string size = std::to_string(chunks) + " chunks" + (last < kR ? ", last not full" : "");
    if (chunks > 1) {  // run(StepInput) launches a step of one chunk as a chunk
      const std::uint64_t flat_before = ex.flat_steps();
      const int runs = measure_step(ex, splitter, in, /*eager=*/false, "step-flat/" + program + "/" + size, rep);
      SPG_EXPECTS_AS(StateError, ex.flat_steps() == flat_before + static_cast<std::uint64_t>(runs),
                     "bench: the step of " << size << " did not launch its flat step graph");
    }
    const std::uint64_t flat_staged = ex.flat_steps();
    measure_staged(ex, in, "staged-flat/" + program + "/" + size, rep);
    SPG_EXPECTS_AS(StateError, ex.flat_steps() > flat_staged,
                   "bench: the staged step of " << size << " did not launch its flat graphs");
  }
  SPG_EXPECTS_AS(StateError, ex.read_run_faults().total() == 0, "bench: the flat steps faulted");
}

}  // namespace

void run_relaunch_probe(Reporter& rep) {
  // Table D measured one step exec's cudaGraphLaunch onto an idle device growing with the chunks
  // its previous launch ran (8 layers: ~5 / 20 / 44 us for 1 / 4 / 16 chunks, one host). Where is
  // that cost paid, and can it be paid ahead? Per step size: after a synchronization, the launch
  // alone; cudaGraphUpload of the exec, then the launch; 2 ms of host idling, then the launch; a
  // launch of another exec of the same graph (last run with the same step) after the exec's own.
  const model::PipelineConfig config = step_config(true);
  graphs::ExecutorOptions opt;
  opt.max_step_requests = kMaxChunks * kR;
  opt.max_step_tokens = kMaxChunks * kT;
  graphs::Executor ex(config, opt);
  (void)ex.warmup();
  fill_inputs(ex);
  const graphs::GraphExec exec = graphs::GraphExec::instantiate(ex.record_step_graph(0, 0).graph, ex.stream());
  const graphs::GraphExec other = graphs::GraphExec::instantiate(ex.record_step_graph(0, 0).graph, ex.stream());
  cudaStream_t stream = ex.stream();
  using Clock = std::chrono::steady_clock;
  // Launched from the device: the same graphs instantiated for device launch, each started by a
  // one-node graph whose kernel tail-launches it, so the host launches one kernel node whatever
  // the program (the route issue 18 names; cudaGraphLaunch of the real graphs grows with the
  // work of their last run on some hosts). A graph the driver refuses for device launch is
  // reported as such, not timed.
  core::DeviceBuffer launch_status(sizeof(int));
  auto device_exec = [&](const graphs::Graph& g, const std::string& what) -> std::unique_ptr<graphs::GraphExec> {
    try {
      return std::make_unique<graphs::GraphExec>(
          graphs::GraphExec::instantiate(g, stream, cudaGraphInstantiateFlagDeviceLaunch));
    } catch (const CudaError& e) {
      (void)cudaGetLastError();
      std::printf("  %-48s not device-launchable: %s\n", what.c_str(), e.what());
      rep.add({"executor", "launch-probe/device-launch/" + what, "graph", "device_launchable", 0.0});
      return nullptr;
    }
  };
  const std::unique_ptr<graphs::GraphExec> dev_step = device_exec(ex.record_step_graph(0, 0).graph, "8-layer step graph");
  const std::unique_ptr<graphs::GraphExec> dev_step_launcher =
      dev_step ? std::make_unique<graphs::GraphExec>(
                     make_tail_launcher(dev_step->get(), static_cast<int*>(launch_status.data()), stream))
               : nullptr;
  core::Event ev_a;
  core::Event ev_b;
  // Host µs of `launch` after a synchronization and queued right behind a launch of the same,
  // and the GPU µs of one launch (events around it); each launch's device-side status checked
  // where `checked`.
  auto time_launches = [&](const std::string& row, const std::function<cudaError_t()>& launch, bool checked) {
    std::vector<double> after_sync, queued, gpu;
    for (int i = 0; i < 25; ++i) {
      if (checked) SPG_CUDA_TRY(cudaMemsetAsync(launch_status.data(), 0xFF, sizeof(int), stream));
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      Clock::time_point t0 = Clock::now();
      SPG_CUDA_TRY(launch());
      Clock::time_point t1 = Clock::now();
      SPG_CUDA_TRY(launch());
      Clock::time_point t2 = Clock::now();
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      if (checked) {
        int st = -1;
        SPG_CUDA_TRY(cudaMemcpy(&st, launch_status.data(), sizeof(int), cudaMemcpyDeviceToHost));
        SPG_EXPECTS_AS(StateError, st == 0, "bench: the device-side launch of " << row << " returned " << st);
      }
      const double g = gpu_us(ex, ev_a, ev_b, [&] { SPG_CUDA_TRY(launch()); });
      if (i < 5) continue;
      after_sync.push_back(us_between(t0, t1));
      queued.push_back(us_between(t1, t2));
      gpu.push_back(g);
    }
    add_metrics(rep, row, "graph",
                {{"host_launch_us_after_sync", median(after_sync)},
                 {"host_launch_us_queued", median(queued)},
                 {"gpu_us_idle", median(gpu)}});
    std::printf("  %-64s cudaGraphLaunch after a sync %.2f us, queued %.2f us; GPU %.1f us\n", row.c_str(),
                median(after_sync), median(queued), median(gpu));
  };
  for (const int chunks : {1, 4, 16}) {
    BenchStep step;
    (void)stage_in_both_blocks(ex, config, chunks, step);
    SPG_CUDA_TRY(exec.launch(stream));
    SPG_CUDA_TRY(other.launch(stream));
    SPG_CUDA_TRY(cudaStreamSynchronize(stream));
    std::vector<double> idle, upload, after_upload, after_sleep, other_after;
    for (int i = 0; i < 25; ++i) {
      Clock::time_point t0 = Clock::now();
      SPG_CUDA_TRY(exec.launch(stream));
      Clock::time_point t1 = Clock::now();
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      const double a = us_between(t0, t1);
      t0 = Clock::now();
      SPG_CUDA_TRY(cudaGraphUpload(exec.get(), stream));
      t1 = Clock::now();
      SPG_CUDA_TRY(exec.launch(stream));
      Clock::time_point t2 = Clock::now();
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      const double b = us_between(t0, t1);
      const double c = us_between(t1, t2);
      t0 = Clock::now();
      while (us_between(t0, Clock::now()) < 2000.0) {
      }
      t0 = Clock::now();
      SPG_CUDA_TRY(exec.launch(stream));
      t1 = Clock::now();
      SPG_CUDA_TRY(other.launch(stream));
      t2 = Clock::now();
      SPG_CUDA_TRY(cudaStreamSynchronize(stream));
      if (i < 5) continue;
      idle.push_back(a);
      upload.push_back(b);
      after_upload.push_back(c);
      after_sleep.push_back(us_between(t0, t1));
      other_after.push_back(us_between(t1, t2));
    }
    const std::string row = "launch-probe/relaunch/8-layer step graph, " + std::to_string(chunks) + " chunks";
    add_metrics(rep, row, "graph",
                {{"host_launch_us_after_sync", median(idle)},
                 {"host_upload_us_after_sync", median(upload)},
                 {"host_launch_us_after_upload", median(after_upload)},
                 {"host_launch_us_after_sync_and_2ms", median(after_sleep)},
                 {"host_launch_us_other_exec_queued", median(other_after)}});
    std::printf("  %-48s cudaGraphLaunch after a sync %.2f us; cudaGraphUpload %.2f then launch %.2f us; after a sync and 2 ms "
                "%.2f us; another exec queued behind it %.2f us\n",
                row.c_str(), median(idle), median(upload), median(after_upload), median(after_sleep), median(other_after));
    const std::string size = std::to_string(chunks) + " chunks";
    time_launches("launch-probe/device-launch/8-layer step graph, " + size + ", host-launched",
                  [&] { return exec.launch(stream); }, false);
    if (dev_step_launcher) {
      time_launches("launch-probe/device-launch/8-layer step graph, " + size + ", device-launched",
                    [&] { return dev_step_launcher->launch(stream); }, true);
    }
    if (chunks > 1) {  // the flat graph of `chunks` all-full chunks, ~40 kernel nodes a chunk
      const graphs::Graph flat = ex.record_flat_step_graph(0, chunks, 0);
      const graphs::GraphExec host_flat = graphs::GraphExec::instantiate(flat, stream);
      time_launches("launch-probe/device-launch/8-layer flat graph, " + size + ", host-launched",
                    [&] { return host_flat.launch(stream); }, false);
      const std::unique_ptr<graphs::GraphExec> dev_flat = device_exec(flat, "8-layer flat graph, " + size);
      if (dev_flat) {
        const graphs::GraphExec launcher =
            make_tail_launcher(dev_flat->get(), static_cast<int*>(launch_status.data()), stream);
        time_launches("launch-probe/device-launch/8-layer flat graph, " + size + ", device-launched",
                      [&] { return launcher.launch(stream); }, true);
      }
    }
  }
  SPG_EXPECTS_AS(StateError, ex.read_run_faults().total() == 0, "bench: the relaunch probe's steps faulted");
}

void run_step_benchmarks(Reporter& rep) {
  for (const bool model : {false, true}) {
    const model::PipelineConfig config = step_config(model);
    graphs::ExecutorOptions opt;
    opt.time_host_phases = true;
    opt.max_step_requests = kMaxChunks * kR;
    opt.max_step_tokens = kMaxChunks * kT;
    graphs::Executor ex(config, opt);
    const graphs::WarmupReport w = ex.warmup();
    fill_inputs(ex);
    const std::string program = model ? "8-layer" : "1-layer";
    std::printf("  steps, %s program: %d step graphs of %d bucket bodies, capture %.0f ms (all graphs)\n",
                program.c_str(), w.step_graphs, w.buckets, w.capture_ms);
    graphs::StepSplitter splitter(config, ex.step_layout());
    core::Event a;
    core::Event b;
    {
      const int last = ex.buckets().size() - 1;
      const graphs::Graph chunk_graph = ex.record_graph(0, last, 0);
      std::printf("  structure, %s chunk graph (largest bucket): %s\n", program.c_str(),
                  describe_graph(chunk_graph.get()).c_str());
      const graphs::StepGraph sg = ex.record_step_graph(0, 0);
      std::printf("  structure, %s step graph: top %s; first loop body %s; loop body %s; largest bucket body %s\n",
                  program.c_str(), describe_graph(sg.graph.get()).c_str(), describe_graph(sg.fast_loop_body).c_str(),
                  describe_graph(sg.loop_body).c_str(), describe_graph(sg.bucket_bodies.back()).c_str());
      // One chunk (4 requests of 64 tokens) through run(chunk): the per-chunk graphs' launch.
      BenchStep one;
      make_step(config, 1, one);
      const graphs::StepInput in{one.requests};
      (void)splitter.split(in);
      time_runs(ex, splitter.chunk(0), "chunk/" + program + "/1 chunk", "spgraph-graph", rep);
      require(ex.run(in));  // both staging blocks hold a valid one-chunk step for the direct launches
      require(ex.run(in));
      ex.synchronize();
      probe_real_kernels(chunk_graph, ex.stream(), program, rep);  // on the chunk just staged
      // The real graphs launched directly (no executor host path): one exec relaunched while its
      // last launch is queued, against two alternating, idle and busy.
      // A graph with conditional nodes instantiates once: each step exec from its own recording.
      const graphs::Graph chunk_graph_2 = ex.record_graph(0, last, 0);
      const graphs::Graph step_graphs[2] = {ex.record_step_graph(0, 0).graph, ex.record_step_graph(0, 0).graph};
      const graphs::Graph* graphs_of[2][2] = {{&chunk_graph, &chunk_graph_2}, {&step_graphs[0], &step_graphs[1]}};
      const char* names[] = {"chunk graph", "step graph"};
      for (int g = 0; g < 2; ++g) {
        graphs::GraphExec execs[2] = {graphs::GraphExec::instantiate(*graphs_of[g][0], ex.stream()),
                                      graphs::GraphExec::instantiate(*graphs_of[g][1], ex.stream())};
        for (const int n : {1, 2}) {
          const LaunchLoad l = measure_launch_load(
              [&](int i) { return execs[i].launch(ex.stream()); }, ex.stream(), n);
          const std::string row = "launch-probe/real/" + program + " " + names[g] + (n == 1 ? "" : ", 2 execs");
          rep.add({"executor", row, "graph", "host_launch_us_idle", l.idle_us});
          rep.add({"executor", row, "graph", "host_launch_us_busy", l.busy_us});
          rep.add({"executor", row, "graph", "host_launch_us_after_launch", l.running_us});
          std::printf("  %-48s cudaGraphLaunch idle %.2f us, busy %.2f us, right after a launch %.2f us\n", row.c_str(),
                      l.idle_us, l.busy_us, l.running_us);
        }
      }
    }
    // The real step graph launched directly (no staging write before it) on an idle device, with
    // each step size staged: does its launch grow with the chunks its launches loop over?
    const graphs::GraphExec direct = graphs::GraphExec::instantiate(ex.record_step_graph(0, 0).graph, ex.stream());
    const graphs::GraphExec direct_other = graphs::GraphExec::instantiate(ex.record_step_graph(0, 0).graph, ex.stream());
    for (const int chunks : {1, 4, 16}) {
      BenchStep step;
      const graphs::StepInput in = stage_in_both_blocks(ex, config, chunks, step);
      {
        std::vector<double> us;
        for (int i = 0; i < 45; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          SPG_CUDA_TRY(direct.launch(ex.stream()));
          const auto t1 = std::chrono::steady_clock::now();
          SPG_CUDA_TRY(cudaStreamSynchronize(ex.stream()));
          if (i >= 5) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
        const std::string row = "launch-probe/real/" + program + " step graph, " + std::to_string(chunks) + " chunks staged";
        rep.add({"executor", row, "graph", "host_launch_us", median(us)});
        std::printf("  %-56s cudaGraphLaunch idle %.2f us\n", row.c_str(), median(us));
        // Relaunching the step graph while its previous launch runs (half-way, ~20 us before its
        // end) or after it, against launching another exec of the same graph at the same moment.
        std::vector<double> gpu;
        for (int i = 0; i < 5; ++i) gpu.push_back(gpu_us(ex, a, b, [&] { SPG_CUDA_TRY(direct.launch(ex.stream())); }));
        const double t_step = median(gpu);
        for (const auto& [when, offset] : {std::pair{"half-way", t_step / 2}, std::pair{"near-end", t_step - 20.0},
                                           std::pair{"after-end", t_step + 200.0}}) {
          for (const bool same : {true, false}) {
            std::vector<double> re;
            for (int i = 0; i < 12; ++i) {
              const auto t0 = std::chrono::steady_clock::now();
              SPG_CUDA_TRY(direct.launch(ex.stream()));
              while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() < offset) {
              }
              const auto t1 = std::chrono::steady_clock::now();
              SPG_CUDA_TRY((same ? direct : direct_other).launch(ex.stream()));
              const auto t2 = std::chrono::steady_clock::now();
              SPG_CUDA_TRY(cudaStreamSynchronize(ex.stream()));
              if (i >= 2) re.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
            }
            const std::string rrow = row + ", relaunch " + when + (same ? "" : " (other exec)");
            rep.add({"executor", rrow, "graph", "host_launch_us", median(re)});
            std::printf("  %-80s cudaGraphLaunch %.2f us\n", rrow.c_str(), median(re));
          }
        }
      }
      const std::string name = "step/" + program + "/" + std::to_string(chunks) + " chunks";
      (void)measure_step(ex, splitter, in, /*eager=*/true, name, rep);
      time_runs(ex, in, name, "spgraph-step", rep);
      measure_staged(ex, in, "staged/" + program + "/" + std::to_string(chunks) + " chunks", rep);
    }
    // Steps whose last chunk is one request (not full): the step graph's second loop runs it,
    // through its SWITCH at its own bucket (time_flat_steps pads the same steps instead; a staged
    // step of one chunk takes its bucket's plain graph there).
    for (const int chunks : {1, 4, 16}) {
      BenchStep step;
      make_step(config, chunks, step, 1);
      const graphs::StepInput in{step.requests};
      const std::string size = std::to_string(chunks) + " chunks, last not full";
      if (chunks > 1) (void)measure_step(ex, splitter, in, /*eager=*/true, "step/" + program + "/" + size, rep);
      measure_staged(ex, in, "staged/" + program + "/" + size, rep);
    }
    SPG_EXPECTS_AS(StateError, ex.read_run_faults().total() == 0, "bench: the step benchmark's steps faulted");
    time_flat_steps(config, opt, program, rep);
  }
}

}  // namespace spg::bench
