// The staging hazard without CUDA events (docs/graphs.md, "The staging hazard"): the host never
// rewrites a staging block the device has not read yet, launches on another stream are still
// ordered after the last one, and what the executor reports (waits, faults) stays right. The
// device is held behind a spin kernel so that the host runs far ahead of it; every launch's
// outputs are copied aside on the device and compared with the same input run on its own.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "spgraph/core/resources.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/kernels/spin/spin.hpp"

using namespace spg;
using spg::test::ChunkData;
using spg::test::LayerOutputs;
using spg::test::World;

namespace {

constexpr unsigned long long kSpinNs = 20'000'000ULL;  // 20 ms: far longer than the host's launches
constexpr int kMinSeq = 1100;  // one set of random top-k indices is valid for every chunk

void require_ok(const graphs::RunResult& r) {
  INFO("run status: " << graphs::run_status_name(r.status) << ", cuda: " << cudaGetErrorName(r.cuda)
                      << (r.bad_field != nullptr ? std::string(", ") + r.bad_field + ": " + r.bad_reason : std::string()));
  REQUIRE(r.ok());
}

/// Layer 0's out and lse, all T rows, copied on `stream` into slot `i` of two device arrays.
/// Layer 0's output rows: max(T, S), a whole step's with steps (every row a launch may write).
std::size_t output_rows(const graphs::Executor& ex) { return ex.layer(0).out.extent(0); }

struct Aside {
  std::size_t out_elems;
  std::size_t lse_elems;
  core::DeviceBuffer out;
  core::DeviceBuffer lse;
  Aside(const graphs::Executor& ex, int slots)
      : out_elems(output_rows(ex) * static_cast<std::size_t>(ex.config().layers[0].h_q) *
                  static_cast<std::size_t>(ex.config().layers[0].d_v)),
        lse_elems(output_rows(ex) * static_cast<std::size_t>(ex.config().layers[0].h_q)),
        out(static_cast<std::size_t>(slots) * out_elems * 2),
        lse(static_cast<std::size_t>(slots) * lse_elems * 4) {}
  void copy(const graphs::Executor& ex, int i, cudaStream_t stream) const {
    const graphs::LayerBuffers& v = ex.layer(0);
    SPG_CUDA_TRY(cudaMemcpyAsync(static_cast<std::uint16_t*>(out.data()) + static_cast<std::size_t>(i) * out_elems,
                                 v.out.data_handle(), out_elems * 2, cudaMemcpyDeviceToDevice, stream));
    SPG_CUDA_TRY(cudaMemcpyAsync(static_cast<float*>(lse.data()) + static_cast<std::size_t>(i) * lse_elems,
                                 v.lse.data_handle(), lse_elems * 4, cudaMemcpyDeviceToDevice, stream));
  }
  LayerOutputs read(int i) const {
    LayerOutputs o;
    o.out.resize(out_elems);
    o.lse.resize(lse_elems);
    SPG_CUDA_TRY(cudaMemcpy(o.out.data(), static_cast<const std::uint16_t*>(out.data()) + static_cast<std::size_t>(i) * out_elems,
                            out_elems * 2, cudaMemcpyDeviceToHost));
    SPG_CUDA_TRY(cudaMemcpy(o.lse.data(), static_cast<const float*>(lse.data()) + static_cast<std::size_t>(i) * lse_elems,
                            lse_elems * 4, cudaMemcpyDeviceToHost));
    return o;
  }
};

/// The first `tokens` token rows of layer 0's out and lse are bit-identical.
bool same_rows(const LayerOutputs& a, const LayerOutputs& b, int tokens, const graphs::Executor& ex) {
  const auto rows = static_cast<std::size_t>(tokens) * static_cast<std::size_t>(ex.config().layers[0].h_q);
  const auto d_v = static_cast<std::size_t>(ex.config().layers[0].d_v);
  return std::memcmp(a.out.data(), b.out.data(), rows * d_v * 2) == 0 && std::memcmp(a.lse.data(), b.lse.data(), rows * 4) == 0;
}

/// Layer 0's outputs after `run` alone: outputs poisoned, run, waited for.
template <class Run>
LayerOutputs alone(graphs::Executor& ex, Run&& run) {
  test::poison_outputs(ex);
  require_ok(run());
  return test::read_outputs(ex, 0, static_cast<int>(output_rows(ex)));
}

graphs::ExecutorOptions no_insert(bool steps) {
  graphs::ExecutorOptions o;
  o.insert = false;  // the caches stay as they are: each launch's outputs depend on its own input only
  if (steps) {
    o.max_step_requests = 32;
    o.max_step_tokens = 512;
  }
  return o;
}

/// A step of `query_lens` requests, each at least kMinSeq long; block tables overlap (no insert).
struct StepData {
  std::vector<graphs::RequestInput> requests;
  std::vector<std::vector<std::int32_t>> swa, compressed;
  graphs::StepInput input() const { return graphs::StepInput{requests}; }
};

StepData make_step(const model::PipelineConfig& cfg, const std::vector<int>& query_lens, std::mt19937_64& rng) {
  StepData s;
  const std::size_t n = query_lens.size();
  s.requests.resize(n);
  s.swa.resize(n);
  s.compressed.resize(n);
  for (std::size_t b = 0; b < n; ++b) {
    graphs::RequestInput& r = s.requests[b];
    r.query_len = query_lens[b];
    r.seq_len = kMinSeq + static_cast<int>(rng() % static_cast<std::uint64_t>(cfg.max_model_len - kMinSeq - r.query_len)) +
                r.query_len;
    for (int i = 0; i < cfg.swa_blocks_per_request(); ++i) {
      s.swa[b].push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(cfg.cache.swa_blocks)));
    }
    for (int i = 0; i < cfg.compressed_blocks_per_request(); ++i) {
      s.compressed[b].push_back(static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(cfg.cache.compressed_blocks)));
    }
  }
  for (std::size_t b = 0; b < n; ++b) {
    s.requests[b].swa_blocks = s.swa[b];
    for (int i = 1; i < graphs::kNumRatios; ++i) s.requests[b].compressed_blocks[i] = s.compressed[b];
  }
  return s;
}

/// The rows a step writes: its tokens, each chunk at its row offset (padded rows are not written).
int step_rows(const StepData& s) {
  int rows = 0;
  for (const graphs::RequestInput& r : s.requests) rows += r.query_len;
  return rows;
}

/// Launches [0, n) whose outputs `same(i)` says differ from their input run alone: how many, and
/// the first (-1: none).
struct Mismatches {
  int count{0};
  int first{-1};
};
template <class Same>
Mismatches mismatches_of(int n, Same&& same) {
  Mismatches m;
  for (int i = 0; i < n; ++i) {
    if (same(i)) continue;
    ++m.count;
    if (m.first < 0) m.first = i;
  }
  return m;
}

}  // namespace

TEST_CASE("chunks launched far ahead of a busy device each read their own staging block", "[gpu][staging]") {
  graphs::Executor ex(test::small_program(), no_insert(false));
  ex.warmup();
  World world(ex, 41);
  std::vector<ChunkData> variants;
  for (int v = 0; v < 8; ++v) variants.push_back(world.random_chunk(1 + v % 4, 9 + 7 * v, -1, kMinSeq));
  world.randomize_topk_all(kMinSeq);
  std::vector<LayerOutputs> want;
  for (const ChunkData& c : variants) want.push_back(alone(ex, [&] { return ex.run(c.input()); }));

  constexpr int kLaunches = 64;
  const Aside aside(ex, kLaunches);
  std::vector<int> order(kLaunches);
  for (int& o : order) o = static_cast<int>(world.rng()() % variants.size());
  const std::uint64_t waits = ex.host_waits();
  double waited_us = 0;
  // The device spins while the host submits: without the release words' wait, launch k + 2 would
  // rewrite the block launch k has not read yet, and launch k would run on launch k + 2's chunk.
  REQUIRE(kernels::launch_spin(kSpinNs, ex.stream()) == cudaSuccess);
  for (int i = 0; i < kLaunches; ++i) {
    const ChunkData& c = variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    const graphs::RunResult r = i % 5 == 4 ? ex.run_eager(c.input()) : ex.run(c.input());
    require_ok(r);
    waited_us += r.waited_us;
    aside.copy(ex, i, ex.stream());
  }
  ex.synchronize();
  CHECK(ex.host_waits() > waits);  // the host did run ahead and wait for the device
  CHECK(waited_us > 1000.0);       // ... for the spin, at the third launch
  const Mismatches bad = mismatches_of(kLaunches, [&](int i) {
    const auto v = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
    const int b = ex.buckets().lookup(static_cast<int>(variants[v].requests.size()), variants[v].tokens());
    return same_rows(aside.read(i), want[v], ex.buckets().t_of(b), ex);
  });
  INFO("first launch whose outputs differ from its chunk run alone: " << bad.first);
  CHECK(bad.count == 0);
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("steps launched far ahead of a busy device each read their own staging block", "[gpu][staging]") {
  model::PipelineConfig cfg = test::small_program();
  graphs::Executor ex(cfg, no_insert(true));
  ex.warmup();
  World world(ex, 43);
  world.randomize_topk_all(kMinSeq);
  std::mt19937_64& rng = world.rng();
  std::vector<StepData> steps;
  for (int v = 0; v < 6; ++v) {
    std::vector<int> lens;
    const int n = 1 + static_cast<int>(rng() % 12);
    for (int b = 0; b < n; ++b) lens.push_back(1 + static_cast<int>(rng() % 40));
    steps.push_back(make_step(ex.config(), lens, rng));
  }
  steps.push_back(StepData{});  // a step of no chunks: head releases its block
  std::vector<LayerOutputs> want;
  std::vector<int> rows;
  for (const StepData& s : steps) {
    want.push_back(alone(ex, [&] { return ex.run(s.input()); }));
    rows.push_back(step_rows(s));
  }
  // A lone chunk between steps: chunk and step launches share the sequence numbers.
  const ChunkData lone = world.random_chunk(3, 40, -1, kMinSeq);
  const LayerOutputs lone_want = alone(ex, [&] { return ex.run(lone.input()); });
  const int lone_rows = ex.buckets().t_of(ex.buckets().lookup(3, 40));

  constexpr int kLaunches = 48;
  const Aside aside(ex, kLaunches);
  std::vector<int> order(kLaunches);
  for (int& o : order) o = static_cast<int>(rng() % (steps.size() + 1));  // steps.size(): the lone chunk
  const std::uint64_t waits = ex.host_waits();
  REQUIRE(kernels::launch_spin(kSpinNs, ex.stream()) == cudaSuccess);
  for (int i = 0; i < kLaunches; ++i) {
    const auto v = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
    require_ok(v == steps.size() ? ex.run(lone.input()) : (i % 7 == 6 ? ex.run_eager(steps[v].input()) : ex.run(steps[v].input())));
    aside.copy(ex, i, ex.stream());
  }
  ex.synchronize();
  CHECK(ex.host_waits() > waits);
  const Mismatches bad = mismatches_of(kLaunches, [&](int i) {
    const auto v = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
    return v == steps.size() ? same_rows(aside.read(i), lone_want, lone_rows, ex)
                             : same_rows(aside.read(i), want[v], rows[v], ex);
  });
  INFO("first launch whose outputs differ from its input run alone: " << bad.first);
  CHECK(bad.count == 0);
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("a launch on another stream runs after the last one, whichever stream is busy", "[gpu][staging]") {
  graphs::Executor ex(test::small_program(), no_insert(false));
  ex.warmup();
  World world(ex, 47);
  const ChunkData first = world.random_chunk(2, 30, -1, kMinSeq);
  const ChunkData second = world.random_chunk(2, 31, -1, kMinSeq);
  world.randomize_topk_all(kMinSeq);
  const LayerOutputs want_second = alone(ex, [&] { return ex.run(second.input()); });
  const int rows = ex.buckets().t_of(ex.buckets().lookup(2, 31));
  REQUIRE(ex.buckets().lookup(2, 30) == ex.buckets().lookup(2, 31));
  core::Stream a;
  core::Stream b;
  // Four stream changes, the stream of the earlier launch held busy each time: the later launch
  // must wait for it, or the earlier one (behind the spin) would overwrite the shared outputs last.
  const cudaStream_t streams[] = {a.get(), b.get(), a.get(), ex.stream(), a.get()};
  for (std::size_t k = 0; k + 1 < std::size(streams); ++k) {
    INFO("from stream " << k << " to stream " << k + 1);
    REQUIRE(kernels::launch_spin(kSpinNs / 4, streams[k]) == cudaSuccess);
    require_ok(ex.run(first.input(), 0, streams[k]));
    require_ok(ex.run(second.input(), 0, streams[k + 1]));
    ex.synchronize();  // waits for the last launch's stream, which the earlier one is ordered before
    // Every stream drained: had the later launch not waited, the earlier one would have run last.
    SPG_CUDA_TRY(cudaDeviceSynchronize());
    CHECK(same_rows(test::read_outputs(ex, 0, ex.config().max_tokens), want_second, rows, ex));
  }
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("synchronize and the run's faults wait for a launch on a caller's busy stream", "[gpu][staging]") {
  graphs::Executor ex(test::small_program(), no_insert(false));
  ex.warmup();
  World world(ex, 53);
  const ChunkData c = world.random_chunk(2, 20, -1, kMinSeq);
  world.randomize_topk_all(kMinSeq);
  const LayerOutputs want = alone(ex, [&] { return ex.run(c.input()); });
  core::Stream s;
  REQUIRE(kernels::launch_spin(kSpinNs, s.get()) == cudaSuccess);
  test::poison_outputs(ex);  // synchronizes first: the spin is not a launch of the executor's
  REQUIRE(kernels::launch_spin(kSpinNs, s.get()) == cudaSuccess);
  require_ok(ex.run(c.input(), 0, s.get()));
  CHECK(cudaStreamQuery(s.get()) == cudaErrorNotReady);  // still spinning
  CHECK(ex.read_run_faults().total() == 0);               // waits for the launch on s
  CHECK(cudaStreamQuery(s.get()) == cudaSuccess);
  const int rows = ex.buckets().t_of(ex.buckets().lookup(2, 20));
  CHECK(same_rows(test::read_outputs(ex, 0, ex.config().max_tokens), want, rows, ex));
}

// The bench's gated launches (table A, `--launch gated`) rest on this kernel: the device must not
// pass the gate before the host opens it, must pass it soon after, and must pass it by itself once
// its timeout runs out, so that a host that never opens it cannot block the stream for good.
TEST_CASE("a launch gate holds its stream until the host opens it or its timeout passes", "[gpu][staging][gate]") {
  using Clock = std::chrono::steady_clock;
  const auto seconds_since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  core::PinnedBuffer word(sizeof(unsigned));
  auto* gate = static_cast<unsigned*>(word.data());
  std::atomic_ref<unsigned>(*gate).store(0);
  core::Stream s;
  core::Event passed;

  // Opened by the host: closed for 50 ms, then through within a second of the store.
  REQUIRE(kernels::launch_gate(gate, 1, 10'000'000'000ULL, s.get()) == cudaSuccess);
  passed.record(s.get());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(cudaEventQuery(passed.get()) == cudaErrorNotReady);
  auto t0 = Clock::now();
  std::atomic_ref<unsigned>(*gate).store(1, std::memory_order_release);
  SPG_CUDA_TRY(cudaStreamSynchronize(s.get()));
  CHECK(seconds_since(t0) < 1.0);

  // Already open (the word is past the value asked for): no wait.
  REQUIRE(kernels::launch_gate(gate, 1, 10'000'000'000ULL, s.get()) == cudaSuccess);
  t0 = Clock::now();
  SPG_CUDA_TRY(cudaStreamSynchronize(s.get()));
  CHECK(seconds_since(t0) < 1.0);

  // Never opened: through by itself after its 200 ms timeout, not before.
  REQUIRE(kernels::launch_gate(gate, 2, 200'000'000ULL, s.get()) == cudaSuccess);
  t0 = Clock::now();
  SPG_CUDA_TRY(cudaStreamSynchronize(s.get()));
  const double waited = seconds_since(t0);
  CHECK(waited >= 0.15);
  CHECK(waited < 5.0);
  SPG_CUDA_TRY(cudaGetLastError());
}
