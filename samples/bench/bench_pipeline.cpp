// Tables B and D: see bench_pipeline.hpp.
#include "samples/bench/bench_pipeline.hpp"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/kernels/synthetic_front/synthetic_front.hpp"
#include "spgraph/memory/allocation_counter.hpp"
#include "samples/engine_buffers.hpp"
#include "samples/serve_loop_verify.hpp"

namespace spg::bench {

void fill_layer_inputs(graphs::Executor& ex) {
  const auto& c = ex.config();
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const auto& layer = c.layers[l];
    const graphs::LayerBuffers& v = ex.layer(l);
    for (const graphs::PagedCache* cache : {&v.swa_cache, &v.compressed_cache}) {
      if (cache->data == nullptr) continue;
      const kernels::CacheLayout& cl = cache->layout;
      SPG_CUDA_TRY(kernels::SyntheticFront::fill_cache(cache->data, cl.num_blocks, cl.block_size, cl.block_stride,
                                                       (cache == &v.swa_cache ? 11 : 23) + l, ex.stream()));
    }
    const std::size_t elems = v.q.extent(0) * layer.h_q * layer.d_qk;  // every row a launch reads
    SPG_CUDA_TRY(kernels::SyntheticFront::fill_query(v.q.data_handle(), elems, 5, static_cast<int>(l), ex.stream()));
    if (layer.attn_sink) {
      std::vector<float> sink(static_cast<std::size_t>(layer.h_q));
      for (std::size_t h = 0; h < sink.size(); ++h) sink[h] = kernels::front_q_value(9, static_cast<int>(l), h);
      SPG_CUDA_TRY(cudaMemcpy(v.attn_sink.data_handle(), sink.data(), sink.size() * 4, cudaMemcpyHostToDevice));
    }
  }
}

namespace {

using graphs::kNumRatios;
using graphs::kRatios;

struct Workload {
  const char* name;
  int requests;
  int new_tokens;  // per request
  int prefix;      // per request
  bool model;      // the 8-layer program; else one C4A layer
  int top_k;
};

constexpr Workload kWorkloads[] = {
    {"tiny", 1, 16, 4096, false, 512},      {"small", 4, 64, 8192, false, 512},
    {"medium", 4, 512, 16384, false, 1024}, {"large", 4, 2048, 32768, false, 1024},
    {"model", 4, 256, 16384, true, 1024},
};

/// Steps rotate over this many chunks whose requests own disjoint cache blocks, so that repeated
/// steps do not read caches the previous step left in L2 (a serving loop's next chunk would not).
constexpr int kRotations = 4;

model::PipelineConfig config_for(const Workload& w) {
  const int T = w.requests * w.new_tokens;
  const int len = (w.prefix + w.new_tokens + 255) / 256 * 256;
  model::PipelineConfig c;
  if (w.model) {
    c = model::PipelineConfig::v4_default();
    c.max_requests = w.requests;
    c.max_tokens = T;
    c.max_model_len = len;
  } else {
    c = model::PipelineConfig::single_layer(model::LayerConfig{128, 512, 512, 128, 4, w.top_k, 0.0F, true},
                                             w.requests, T, len);
  }
  c.cache.swa_blocks = kRotations * w.requests * c.swa_blocks_per_request();
  c.cache.compressed_blocks = kRotations * w.requests * c.compressed_blocks_per_request();
  return c;
}

/// One of the workload's chunks: in rotation k, request b owns blocks
/// [(k * R + b) * per_request, (k * R + b + 1) * per_request) of every cache.
struct BenchChunk {
  std::vector<std::vector<std::int32_t>> swa, comp;
  std::vector<graphs::RequestInput> requests;
  std::vector<std::int32_t> swa_slots;
  std::vector<std::int32_t> comp_slots[kNumRatios];
  std::vector<std::int32_t> qsl{0};
  std::vector<std::int32_t> seq_lens;
  graphs::ChunkInput input;    // with the slot lists
  graphs::ChunkInput derived;  // the same with the slots left to the device
};

void make_chunk(const model::PipelineConfig& c, const Workload& w, int rotation, BenchChunk& out) {
  const int per_swa = c.swa_blocks_per_request();
  const int per_comp = c.compressed_blocks_per_request();
  out.swa.resize(static_cast<std::size_t>(w.requests));
  out.comp.resize(static_cast<std::size_t>(w.requests));
  for (int b = 0; b < w.requests; ++b) {
    auto& s = out.swa[static_cast<std::size_t>(b)];
    auto& k = out.comp[static_cast<std::size_t>(b)];
    const int owner = rotation * w.requests + b;
    for (int i = 0; i < per_swa; ++i) s.push_back(owner * per_swa + i);
    for (int i = 0; i < per_comp; ++i) k.push_back(owner * per_comp + i);
    const int seq = w.prefix + w.new_tokens;
    graphs::RequestInput r;
    r.query_len = w.new_tokens;
    r.seq_len = seq;
    r.swa_blocks = s;
    for (int i = 1; i < kNumRatios; ++i) r.compressed_blocks[i] = k;
    out.requests.push_back(r);
    out.seq_lens.push_back(seq);
    out.qsl.push_back(out.qsl.back() + w.new_tokens);
    for (int p = w.prefix; p < seq; ++p) {
      const int bs = c.cache.swa_block_size;
      out.swa_slots.push_back(static_cast<std::int32_t>(graphs::slot_of(s, bs, p)));
      for (int i = 1; i < kNumRatios; ++i) {
        if ((p + 1) % kRatios[i] != 0) continue;
        const int row = (p + 1) / kRatios[i] - 1;
        const int rpb = c.cache.block_tokens / kRatios[i];
        out.comp_slots[i].push_back(static_cast<std::int32_t>(graphs::slot_of(k, rpb, row)));
      }
    }
  }
  out.input.requests = out.requests;
  out.input.swa_slots = out.swa_slots;
  for (int i = 1; i < kNumRatios; ++i) out.input.compressed_slots[i] = out.comp_slots[i];
  out.derived = out.input;
  out.derived.swa_slots = {};
  for (auto& slots : out.derived.compressed_slots) slots = {};
}

/// Caches full of random data, query rows, sinks and the front's K rows and top-k indices.
void fill_inputs(graphs::Executor& ex, const BenchChunk& chunk) {
  fill_layer_inputs(ex);
  int new_rows[kNumRatios] = {0, static_cast<int>(chunk.comp_slots[1].size()), static_cast<int>(chunk.comp_slots[2].size())};
  SPG_CUDA_TRY(kernels::SyntheticFront::run(samples::make_front_args(samples::front_layers(ex), chunk.qsl, chunk.seq_lens, new_rows, 3, 0),
                                            ex.stream()));
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // the sinks were copied on the legacy stream
}

/// A workload's executor, warmed up for its one chunk shape, with its inputs filled, and the
/// chunks its steps rotate over.
struct PreparedWorkload {
  std::unique_ptr<graphs::Executor> executor;
  BenchChunk chunks[kRotations];
  int next{0};
  /// The steps of table B leave the slots to the device (ChunkInput's slot lists empty), the
  /// fast path; `explicit_slots` hands over the slot lists instead.
  bool explicit_slots{false};
  const graphs::ChunkInput& next_input() {
    const BenchChunk& c = chunks[next++ % kRotations];
    return explicit_slots ? c.input : c.derived;
  }
};

std::unique_ptr<PreparedWorkload> prepare(const Workload& w) {
  const model::PipelineConfig config = config_for(w);
  graphs::ExecutorOptions opt;
  opt.r_buckets = {w.requests};
  opt.t_buckets = {w.requests * w.new_tokens};
  opt.time_host_phases = true;  // three clock reads a step, inside host_us
  auto p = std::make_unique<PreparedWorkload>();
  p->executor = std::make_unique<graphs::Executor>(config, opt);
  p->executor->warmup();
  for (int k = 0; k < kRotations; ++k) make_chunk(config, w, k, p->chunks[k]);
  fill_inputs(*p->executor, p->chunks[0]);
  return p;
}

/// Host time of one step on an idle device: the whole run() call and its phases (medians).
struct HostTimes {
  double total_us;
  double staging_us;
  double launch_us;
  double record_us;
};

HostTimes step_host_us(PreparedWorkload& p, bool graph, int reps) {
  graphs::Executor& ex = *p.executor;
  std::vector<double> us[4];
  for (int i = 0; i < reps + 5; ++i) {
    const graphs::ChunkInput& in = p.next_input();
    const auto t0 = std::chrono::steady_clock::now();
    const graphs::RunResult r = graph ? ex.run(in) : ex.run_eager(in);
    const auto t1 = std::chrono::steady_clock::now();
    SPG_EXPECTS_AS(StateError, r.ok(), "bench: step failed: " << graphs::run_status_name(r.status));
    ex.synchronize();
    if (i < 5) continue;
    us[0].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    us[1].push_back(r.phases.staging_us);
    us[2].push_back(r.phases.launch_us);
    us[3].push_back(r.phases.record_us);
  }
  return {median(us[0]), median(us[1]), median(us[2]), median(us[3])};
}

double back_to_back_us(PreparedWorkload& p, bool graph, int steps) {
  graphs::Executor& ex = *p.executor;
  ex.synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const graphs::ChunkInput& in = p.next_input();
    const graphs::RunResult r = graph ? ex.run(in) : ex.run_eager(in);
    SPG_EXPECTS_AS(StateError, r.ok(), "bench: step failed: " << graphs::run_status_name(r.status));
  }
  ex.synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / steps;
}

}  // namespace

void run_pipeline_benchmarks(Reporter& rep, bool quick) {
  // CUPTI stays unloaded while times are measured (its subscriber slows every cudaGraphLaunch,
  // and after repeated attach/detach cycles later API calls were seen slower); it is attached once at the
  // end to count the allocation calls of 100 replayed steps of every workload.
  const TimingOptions timing{5, quick ? 20 : 30};
  std::vector<std::unique_ptr<PreparedWorkload>> workloads;
  for (const Workload& w : kWorkloads) {
    workloads.push_back(prepare(w));
    graphs::Executor& ex = *workloads.back()->executor;
    PreparedWorkload& pw = *workloads.back();
    auto add = [&](const char* variant, const char* metric, double v) { rep.add({"pipeline", w.name, variant, metric, v}); };

    // Bring the clocks up (the set-up above leaves the GPU idle): replay steps for 300 ms first.
    const auto warm_start = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - warm_start < std::chrono::milliseconds(300)) {
      SPG_EXPECTS_AS(StateError, ex.run(pw.next_input()).ok(), "bench: warm-up step failed");
      ex.synchronize();
    }
    for (bool graph : {true, false}) {
      const char* variant = graph ? "spgraph-graph" : "spgraph-eager";
      add(variant, "gpu_us", median_gpu_us(ex.stream(), [&] {
            const graphs::ChunkInput& in = pw.next_input();
            (void)(graph ? ex.run(in) : ex.run_eager(in));
          }, timing));
      const HostTimes host = step_host_us(pw, graph, timing.reps);
      add(variant, "host_us", host.total_us);
      add(variant, "host_staging_us", host.staging_us);
      add(variant, "host_launch_us", host.launch_us);
      add(variant, "host_record_us", host.record_us);
      add(variant, "wall_us", back_to_back_us(pw, graph, quick ? 50 : 200));
    }
    pw.explicit_slots = true;
    const HostTimes explicit_host = step_host_us(pw, true, timing.reps);
    pw.explicit_slots = false;
    add("spgraph-graph-explicit-slots", "host_us", explicit_host.total_us);
    add("spgraph-graph-explicit-slots", "host_staging_us", explicit_host.staging_us);

    // The floor for the graph: every stage timed on its own, summed. Each stage repeats on the
    // metadata last staged (one chunk, caches warm in L2), so the floor is if anything low.
    const graphs::Pipeline& p = ex.pipeline(0, 0);
    // The first layer's stages are also kept one by one (where a step's time goes).
    double sum = median_gpu_us(ex.stream(), [&] { (void)p.record_stage_in(0, ex.stream()); }, timing);
    add("kernel-stage-in", "gpu_us", sum);
    std::printf("  pipeline %-7s stages (us): stage-in %.1f", w.name, sum);
    for (std::size_t layer = 0; layer < p.layer_count(); ++layer) {
      for (const graphs::Stage stage : graphs::kStages) {
        const double us = median_gpu_us(ex.stream(), [&] { (void)p.record_stage(layer, stage, ex.stream()); }, timing);
        sum += us;
        if (layer == 0) {
          add((std::string("kernel-") + graphs::stage_name(stage)).c_str(), "gpu_us", us);
          std::printf(" %s %.1f", graphs::stage_name(stage), us);
        }
      }
    }
    std::printf("\n");
    add("kernels-sum", "gpu_us", sum);
    const kernels::RunFaults faults = ex.read_run_faults();  // every step of the workload, not just the last
    SPG_EXPECTS_AS(StateError, faults.total() == 0,
                   "bench: workload " << w.name << " raised " << faults.total() << " device faults in "
                                      << faults.faulty_steps << " steps");
    auto value = [&](const char* variant, const char* metric) { return rep.value("pipeline", w.name, variant, metric); };
    std::printf("  pipeline %-7s GPU us: graph %.1f, eager %.1f, sum %.1f; wall us: %.1f / %.1f;"
                " host us: %.2f / %.2f (graph: staging %.2f, launch %.2f, event %.2f)\n", w.name,
                value("spgraph-graph", "gpu_us"), value("spgraph-eager", "gpu_us"), sum, value("spgraph-graph", "wall_us"),
                value("spgraph-eager", "wall_us"), value("spgraph-graph", "host_us"), value("spgraph-eager", "host_us"),
                value("spgraph-graph", "host_staging_us"), value("spgraph-graph", "host_launch_us"),
                value("spgraph-graph", "host_record_us"));
    std::printf("  pipeline %-7s host us with the slot lists: %.2f (staging %.2f)\n", w.name,
                value("spgraph-graph-explicit-slots", "host_us"), value("spgraph-graph-explicit-slots", "host_staging_us"));
  }

  memory::AllocationCounter& counter = memory::AllocationCounter::instance();
  for (std::size_t i = 0; i < workloads.size(); ++i) {
    PreparedWorkload& pw = *workloads[i];
    counter.reset();
    for (int k = 0; k < 100; ++k) (void)pw.executor->run(pw.next_input());
    pw.executor->synchronize();
    rep.add({"pipeline", kWorkloads[i].name, "spgraph-graph", "alloc_calls", static_cast<double>(counter.count()) / 100.0});
    std::printf("  pipeline %-7s allocation calls per replayed step (CUPTI): %.2f\n", kWorkloads[i].name,
                static_cast<double>(counter.count()) / 100.0);
  }
  counter.detach();  // later tables time host work too
}

namespace {

void write_raw(const std::string& path, const void* device, std::size_t bytes) {
  std::vector<char> host(bytes);
  SPG_CUDA_TRY(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost));
  std::ofstream f(path, std::ios::binary);
  f.write(host.data(), static_cast<std::streamsize>(bytes));
  SPG_EXPECTS(f.good(), "--dump: cannot write '" << path << "'");
}

void write_host(const std::string& path, const std::vector<std::int32_t>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  SPG_EXPECTS(f.good(), "--dump: cannot write '" << path << "'");
}

std::string entry(const char* name, const char* dtype, std::initializer_list<std::int64_t> shape) {
  std::string s = std::string("\"") + name + "\": {\"file\": \"" + name + ".bin\", \"dtype\": \"" + dtype + "\", \"shape\": [";
  bool first = true;
  for (std::int64_t d : shape) {
    s += (first ? "" : ", ") + std::to_string(d);
    first = false;
  }
  return s + "]}";
}

}  // namespace

void dump_small_workload(const std::string& dir) {
  const Workload& w = kWorkloads[1];
  const auto prepared = prepare(w);
  graphs::Executor& ex = *prepared->executor;
  const model::PipelineConfig& config = ex.config();
  const BenchChunk& chunk = prepared->chunks[0];
  const graphs::RunResult r = ex.run(chunk.input);
  SPG_EXPECTS_AS(StateError, r.ok(), "--dump: step failed: " << graphs::run_status_name(r.status));
  ex.synchronize();

  const model::LayerConfig& l = config.layers[0];
  const graphs::ChunkMetaLayout meta = graphs::ChunkMetaLayout::make(config);
  const int R = w.requests;
  const int T = R * w.new_tokens;
  const int crows = config.cache.block_tokens / l.compress_ratio;
  const graphs::LayerBuffers& v = ex.layer(0);
  const std::int64_t swa_stride = v.swa_cache.layout.block_stride;
  const std::int64_t c_stride = v.compressed_cache.layout.block_stride;
  auto raw = [&](const char* what, const void* data, std::size_t bytes) { write_raw(dir + "/" + what + ".bin", data, bytes); };
  raw("swa_cache", v.swa_cache.data, v.swa_cache.bytes());
  raw("compressed_cache", v.compressed_cache.data, v.compressed_cache.bytes());
  raw("q", v.q.data_handle(), std::size_t{2} * T * l.h_q * l.d_qk);
  raw("topk_indices", v.topk_indices.data_handle(), std::size_t{4} * T * l.top_k);
  raw("attn_sink", v.attn_sink.data_handle(), std::size_t{4} * l.h_q);
  raw("out", v.out.data_handle(), std::size_t{2} * T * l.h_q * l.d_v);
  raw("lse", v.lse.data_handle(), std::size_t{4} * T * l.h_q);
  raw("max_logits", v.max_logits.data_handle(), std::size_t{4} * T * l.h_q);
  std::vector<std::int32_t> swa_table(static_cast<std::size_t>(R) * meta.swa_table_width, -1);
  std::vector<std::int32_t> c_table(static_cast<std::size_t>(R) * meta.compressed_table_width, -1);
  std::vector<std::int32_t> q_lens;
  std::vector<std::int32_t> seq_lens;
  for (int b = 0; b < R; ++b) {
    const auto& req = chunk.requests[static_cast<std::size_t>(b)];
    q_lens.push_back(req.query_len);
    seq_lens.push_back(req.seq_len);
    const int ns = (req.seq_len + config.cache.swa_block_size - 1) / config.cache.swa_block_size;
    const int nc = (req.seq_len + config.cache.block_tokens - 1) / config.cache.block_tokens;
    std::copy_n(req.swa_blocks.begin(), ns, swa_table.begin() + static_cast<std::ptrdiff_t>(b) * meta.swa_table_width);
    std::copy_n(req.compressed_blocks[1].begin(), nc,
                c_table.begin() + static_cast<std::ptrdiff_t>(b) * meta.compressed_table_width);
  }
  write_host(dir + "/swa_block_table.bin", swa_table);
  write_host(dir + "/compressed_block_table.bin", c_table);
  write_host(dir + "/query_lens.bin", q_lens);
  write_host(dir + "/seq_lens.bin", seq_lens);

  std::ofstream m(dir + "/manifest.json");
  char scale[32];
  std::snprintf(scale, sizeof scale, "%.9g", static_cast<double>(l.scale()));
  m << "{\"workload\": \"" << w.name << "\", \"requests\": " << R << ", \"new_tokens\": " << w.new_tokens
    << ", \"prefix\": " << w.prefix << ", \"h_q\": " << l.h_q << ", \"d_qk\": " << l.d_qk << ", \"d_v\": " << l.d_v
    << ", \"window\": " << l.window << ", \"compress_ratio\": " << l.compress_ratio << ", \"top_k\": " << l.top_k
    << ", \"sm_scale\": " << scale << ", \"swa_block_size\": " << config.cache.swa_block_size
    << ", \"block_tokens\": " << config.cache.block_tokens << ", \"compressed_rows_per_block\": " << crows
    << ",\n \"files\": {" << entry("swa_cache", "uint8", {config.cache.swa_blocks, swa_stride}) << ",\n  "
    << entry("compressed_cache", "uint8", {config.cache.compressed_blocks, c_stride}) << ",\n  "
    << entry("swa_block_table", "int32", {R, meta.swa_table_width}) << ",\n  "
    << entry("compressed_block_table", "int32", {R, meta.compressed_table_width}) << ",\n  "
    << entry("query_lens", "int32", {R}) << ",\n  " << entry("seq_lens", "int32", {R}) << ",\n  "
    << entry("q", "bfloat16", {T, l.h_q, l.d_qk}) << ",\n  " << entry("topk_indices", "int32", {T, l.top_k}) << ",\n  "
    << entry("attn_sink", "float32", {l.h_q}) << ",\n  " << entry("out", "bfloat16", {T, l.h_q, l.d_v}) << ",\n  "
    << entry("lse", "float32", {T, l.h_q}) << ",\n  " << entry("max_logits", "float32", {T, l.h_q}) << "}}\n";
  SPG_EXPECTS(m.good(), "--dump: cannot write '" << dir << "/manifest.json'");
  std::printf("  dumped the small workload's inputs and outputs to %s\n", dir.c_str());
}

void run_executor_benchmarks(Reporter& rep) {
  const model::PipelineConfig config = model::PipelineConfig::v4_default();
  graphs::Executor ex(config);
  const graphs::WarmupReport w = ex.warmup();
  auto add = [&](const char* metric, double v) { rep.add({"executor", "warmup/v4-default", "spgraph", metric, v}); };
  add("capture_ms", w.capture_ms);
  add("eager_ms", w.eager_ms);
  add("graphs", w.graphs);
  add("graph_mib", static_cast<double>(w.graph_device_bytes) / (1 << 20));
  add("pool_gib", static_cast<double>(w.pool_device_bytes) / (1 << 30));
  add("pool_alloc_calls", w.pool_allocation_calls);
  add("kernels_per_step", w.kernel_launches_per_step);
  std::printf("  executor warm-up: %d graphs in %.1f ms, graphs %.1f MiB, pool %.2f GiB\n", w.graphs, w.capture_ms,
              static_cast<double>(w.graph_device_bytes) / (1 << 20), static_cast<double>(w.pool_device_bytes) / (1 << 30));
  // The same program with the engine's caches and tensors bound: the pool keeps only spgraph's own.
  const samples::EngineBuffers engine(config, true);
  graphs::ExecutorOptions bound;
  bound.buffers = engine.bindings();
  graphs::Executor bound_ex(config, bound);
  const graphs::WarmupReport wb = bound_ex.warmup();
  rep.add({"executor", "warmup/v4-default", "spgraph-engine-buffers", "pool_gib",
           static_cast<double>(wb.pool_device_bytes) / (1 << 30)});
  rep.add({"executor", "warmup/v4-default", "spgraph-engine-buffers", "engine_gib",
           static_cast<double>(engine.bytes()) / (1 << 30)});
  std::printf("  executor with engine-owned buffers: pool %.3f GiB (engine holds %.2f GiB), %d graphs in %.1f ms\n",
              static_cast<double>(wb.pool_device_bytes) / (1 << 30), static_cast<double>(engine.bytes()) / (1 << 30),
              wb.graphs, wb.capture_ms);
}

}  // namespace spg::bench
