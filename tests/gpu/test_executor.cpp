// The graph executor: graph replay equals eager and the CPU reference for every bucket, zero
// allocations in steady state, padding, out-of-order replay, back-to-back steps without host
// synchronisation, and failure paths that leave it usable.
#include <cuda_runtime_api.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "graphs/executor.hpp"
#include "graphs/graph.hpp"
#include "kernels/kv_cache/kv_cache.hpp"
#include "memory/allocation_counter.hpp"

using namespace spg;
using spg::test::ChunkData;
using spg::test::LayerOutputs;
using spg::test::World;

namespace {

graphs::ExecutorOptions options(bool insert, std::vector<std::vector<int>> programs = {}) {
  graphs::ExecutorOptions o;
  o.insert = insert;
  o.programs = std::move(programs);
  return o;
}

/// Tokens in (previous T bucket, this T bucket], requests == the R bucket: the chunk fills its bucket's shape.
std::pair<int, int> shape_for(const graphs::BucketSet& b, int bucket, std::mt19937_64& rng) {
  const int ti = bucket % static_cast<int>(b.t_buckets().size());
  const int lo = ti == 0 ? 1 : b.t_buckets()[static_cast<std::size_t>(ti) - 1] + 1;
  const int hi = b.t_of(bucket);
  const int tokens = lo + static_cast<int>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  return {b.r_of(bucket), tokens};
}

// Sequences at least this long, so one set of random top-k indices is valid for every chunk.
constexpr int kMinSeq = 1100;

void require_ok(const graphs::RunResult& r) {
  INFO("run status: " << graphs::run_status_name(r.status) << ", cuda: " << cudaGetErrorName(r.cuda));
  REQUIRE(r.ok());
}

}  // namespace

TEST_CASE("graph replay equals eager launches bit for bit and the reference, for every bucket", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  const graphs::WarmupReport report = ex.warmup();
  CHECK(report.graphs == 2 * ex.buckets().size());
  CHECK(report.pool_allocation_calls == 2);
  World world(ex, 20261130);
  const auto& buckets = ex.buckets();
  const std::vector<int> layers = ex.program_layers(0);
  for (int bucket = 0; bucket < buckets.size(); ++bucket) {
    auto [n, tokens] = shape_for(buckets, bucket, world.rng());
    const ChunkData c = world.random_chunk(n, tokens);
    world.randomize_topk(c);
    INFO("bucket R" << buckets.r_of(bucket) << " T" << buckets.t_of(bucket) << ", " << n << " requests, " << tokens
                    << " tokens");
    // Insert is idempotent (the same rows to the same slots), so eager then graph see the same caches.
    require_ok(ex.run_eager(c.input()));
    std::vector<LayerOutputs> eager;
    for (int l : layers) eager.push_back(test::read_outputs(ex, static_cast<std::size_t>(l), buckets.t_of(bucket)));
    const graphs::RunResult r = ex.run(c.input());
    require_ok(r);
    CHECK(r.bucket == bucket);
    for (std::size_t i = 0; i < layers.size(); ++i) {
      CHECK(test::read_outputs(ex, static_cast<std::size_t>(layers[i]), buckets.t_of(bucket)) == eager[i]);
    }
    CHECK(ex.read_status().total() == 0);
    world.apply_insert(c, layers);
    // The CPU reference on a spread of buckets (it costs seconds per layer on the CPU).
    if (bucket % 4 == 1 || bucket == buckets.size() - 1) {
      for (std::size_t i = 0; i < layers.size(); ++i) {
        const auto l = static_cast<std::size_t>(layers[i]);
        test::check_against_reference(eager[i], world.reference(c, l, buckets.r_of(bucket), buckets.t_of(bucket)),
                                      "layer " + std::to_string(l));
      }
    }
  }
}

TEST_CASE("a chunk without slot lists has its slots derived on the device: same caches and outputs", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 777);
  const std::vector<int> layers = ex.program_layers(0);
  const auto& cfg = ex.config();
  // Every cache of the program: (its view, ratio index).
  struct Cache {
    std::string name;
    graphs::PagedCache cache;
    int ratio_index;
  };
  std::vector<Cache> caches;
  for (int l : layers) {
    const auto li = static_cast<std::size_t>(l);
    caches.push_back({"layer " + std::to_string(l) + " swa", ex.layer(li).swa_cache, 0});
    const int r = cfg.layers[li].compress_ratio;
    if (r > 1) caches.push_back({"layer " + std::to_string(l) + " compressed", ex.layer(li).compressed_cache, graphs::ratio_index(r)});
  }
  auto snapshot = [&] {
    ex.synchronize();
    std::vector<std::vector<std::uint8_t>> bytes;
    for (const Cache& cache : caches) {
      bytes.emplace_back(cache.cache.bytes());
      SPG_CUDA_TRY(cudaMemcpy(bytes.back().data(), cache.cache.data, cache.cache.bytes(), cudaMemcpyDeviceToHost));
    }
    return bytes;
  };
  for (const auto& [n, tokens] : {std::pair{1, 16}, std::pair{3, 45}, std::pair{4, 64}}) {
    INFO(n << " requests, " << tokens << " tokens");
    const ChunkData c = world.random_chunk(n, tokens);
    world.randomize_topk(c);
    const auto before = snapshot();
    require_ok(ex.run(c.input()));  // the slot lists
    const int t_bucket = ex.buckets().t_of(ex.buckets().lookup(n, tokens));
    std::vector<LayerOutputs> listed;
    for (int l : layers) listed.push_back(test::read_outputs(ex, static_cast<std::size_t>(l), t_bucket));
    const auto listed_caches = snapshot();
    for (std::size_t i = 0; i < caches.size(); ++i) {
      INFO("cache " << caches[i].name);
      // The step wrote rows into every cache it had rows for (a compressed cache gets one only
      // when a chunk completes a compressed row).
      const int ri = caches[i].ratio_index;
      const bool changed = listed_caches[i] != before[i];  // a bool: Catch would print whole caches
      if (ri == 0 || !c.compressed_slots[ri].empty()) CHECK(changed);
      SPG_CUDA_TRY(cudaMemcpy(caches[i].cache.data, before[i].data(), caches[i].cache.bytes(),
                              cudaMemcpyHostToDevice));  // undo the insert
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());
    graphs::ChunkInput derived = c.input();
    derived.swa_slots = {};
    for (auto& slots : derived.compressed_slots) slots = {};
    require_ok(ex.run(derived));
    for (std::size_t i = 0; i < layers.size(); ++i) {
      CHECK(test::read_outputs(ex, static_cast<std::size_t>(layers[i]), t_bucket) == listed[i]);
    }
    const auto derived_caches = snapshot();
    for (std::size_t i = 0; i < caches.size(); ++i) {
      INFO("cache " << caches[i].name);
      const bool same = derived_caches[i] == listed_caches[i];
      CHECK(same);
    }
    CHECK(ex.read_status().total() == 0);
    // One list without the other is refused before anything is written.
    graphs::ChunkInput one_list = c.input();
    one_list.swa_slots = {};
    if (!one_list.compressed_slots[1].empty() || !one_list.compressed_slots[2].empty()) {
      CHECK(ex.run(one_list).status == graphs::RunStatus::bad_chunk);
    }
    world.apply_insert(c, layers);
  }
}

TEST_CASE("each stage of a replayed step equals its reference", "[gpu][executor]") {
  // One program per layer, so the shared workspace, indices and lens still hold that layer's values.
  graphs::Executor ex(test::small_program(), options(false, {{0}, {1}, {2}}));
  ex.warmup();
  World world(ex, 31337);
  const ChunkData c = world.random_chunk(3, 45);
  world.randomize_topk(c);
  for (int p = 0; p < 3; ++p) {
    const graphs::RunResult r = ex.run(c.input(), p);
    require_ok(r);
    const int rb = ex.buckets().r_of(r.bucket);
    const int tb = ex.buckets().t_of(r.bucket);
    const auto l = static_cast<std::size_t>(p);
    const auto& layer = ex.config().layers[l];
    test::ref::LayerStepIntermediates want;
    const auto want_out = world.reference(c, l, rb, tb, &want);
    ex.synchronize();
    const std::size_t rows = static_cast<std::size_t>(rb) * static_cast<std::size_t>(ex.config().max_kv_rows(layer));
    std::vector<std::uint16_t> kv(rows * 512);
    SPG_CUDA_TRY(cudaMemcpy(kv.data(), ex.workspace().kv.data_handle(), kv.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<std::int32_t> combined(want.combined.size());
    std::vector<std::int32_t> lens(want.lens.size());
    SPG_CUDA_TRY(cudaMemcpy(combined.data(), ex.workspace().combined_indices.data_handle(), combined.size() * 4,
                            cudaMemcpyDeviceToHost));
    SPG_CUDA_TRY(cudaMemcpy(lens.data(), ex.workspace().combined_lens.data_handle(), lens.size() * 4,
                            cudaMemcpyDeviceToHost));
    INFO("layer " << l);
    CHECK(lens == want.lens);
    int bad_combined = 0;
    for (int t = 0; t < tb; ++t) {
      for (int j = 0; j < want.lens[static_cast<std::size_t>(t)]; ++j) {
        const std::size_t i = static_cast<std::size_t>(t) * layer.combined_width() + static_cast<std::size_t>(j);
        bad_combined += combined[i] != want.combined[i];
      }
    }
    CHECK(bad_combined == 0);
    // Rows every request owns: b * M .. b * M + N + gather_len_b.
    std::size_t bad_kv = 0;
    std::size_t first_bad = 0;
    const std::size_t m = static_cast<std::size_t>(*std::max_element(want.combined.begin(), want.combined.end()) + 1);
    for (std::size_t i = 0; i < std::min(m, rows) * 512; ++i) {
      if (kv[i] != want.kv[i] && want.kv[i] != 0) {
        if (bad_kv++ == 0) first_bad = i;
      }
    }
    INFO("first differing kv element " << first_bad << " (row " << first_bad / 512 << ")");
    CHECK(bad_kv == 0);
    // Attention on the device's own inputs, element by element.
    LayerOutputs got = test::read_outputs(ex, l, tb);
    std::size_t bad_out = 0;
    std::size_t first_out = 0;
    for (std::size_t i = 0; i < got.out.size(); ++i) {
      const double g = test::ref::bf16_value(got.out[i]);
      const double w = want_out.out[i];
      const double err = std::abs(g - w);
      if (!(err <= 8e-4 || err <= std::abs(w) * 2.4e-2)) {
        if (bad_out++ == 0) first_out = i;
      }
    }
    INFO("out: " << bad_out << " of " << got.out.size() << " elements past the bar; first at token "
                 << first_out / (static_cast<std::size_t>(layer.h_q) * 512) << ", head "
                 << first_out / 512 % static_cast<std::size_t>(layer.h_q) << ", d " << first_out % 512 << " (lens "
                 << want.lens[first_out / (static_cast<std::size_t>(layer.h_q) * 512)] << ")");
    CHECK(bad_out == 0);
  }
}

TEST_CASE("one graph serves different sequence lengths of its shape", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 7);
  const int bucket = ex.buckets().lookup(3, 40);
  for (int round = 0; round < 3; ++round) {
    const ChunkData c = world.random_chunk(3, 37 + round, round == 0 ? 150 : -1);  // round 0: seq < window for some
    world.randomize_topk(c);
    const graphs::RunResult r = ex.run(c.input());
    require_ok(r);
    REQUIRE(r.bucket == bucket);
    world.apply_insert(c, ex.program_layers(0));
    for (int l : {0, 1, 2}) {
      test::check_against_reference(test::read_outputs(ex, static_cast<std::size_t>(l), ex.buckets().t_of(bucket)),
                                    world.reference(c, static_cast<std::size_t>(l), ex.buckets().r_of(bucket),
                                                    ex.buckets().t_of(bucket)),
                                    "round " + std::to_string(round) + ", layer " + std::to_string(l));
    }
  }
}

TEST_CASE("padding is harmless: padded requests and tokens write zeros and +inf", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(false));
  ex.warmup();
  World world(ex, 99);
  // Poison everything the pipeline writes: workspace, indices, lens, outputs.
  test::poison(ex.workspace().kv);
  test::poison(ex.workspace().combined_indices);
  test::poison(ex.workspace().combined_lens);
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    test::poison(ex.layer(l).out);
    test::poison(ex.layer(l).lse);
    test::poison(ex.layer(l).max_logits);
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // the memsets ran on the legacy stream
  const ChunkData c = world.random_chunk(2, 21);  // bucket R2 x T24: 3 padded tokens
  world.randomize_topk(c);
  const graphs::RunResult r = ex.run(c.input());
  require_ok(r);
  const int t_bucket = ex.buckets().t_of(r.bucket);
  REQUIRE(t_bucket > 21);
  for (int l : {0, 1, 2}) {
    const auto li = static_cast<std::size_t>(l);
    LayerOutputs got = test::read_outputs(ex, li, t_bucket);
    const auto want = world.reference(c, li, ex.buckets().r_of(r.bucket), t_bucket);
    const int h = ex.config().layers[li].h_q;
    for (std::size_t i = 21 * static_cast<std::size_t>(h); i < got.lse.size(); ++i) {
      INFO("layer " << l << " padded (token, head) " << i);
      REQUIRE(got.lse[i] == std::numeric_limits<float>::infinity());
      REQUIRE(got.max_logits[i] == -std::numeric_limits<float>::infinity());
    }
    for (std::size_t i = 21 * static_cast<std::size_t>(h) * 512; i < got.out.size(); ++i) {
      INFO("layer " << l << " padded out element " << i);
      REQUIRE(got.out[i] == 0);
    }
    test::check_against_reference(got, want, "layer " + std::to_string(l));
  }
}

TEST_CASE("out-of-order replay of buckets and programs gives the in-order results", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(false, {{0, 1, 2}, {2, 0}}));
  ex.warmup();
  World world(ex, 4242);
  struct Step {
    ChunkData chunk;
    int program;
  };
  std::vector<Step> steps;
  steps.push_back({world.random_chunk(1, 9, -1, kMinSeq), 0});
  steps.push_back({world.random_chunk(4, 64, -1, kMinSeq), 1});
  steps.push_back({world.random_chunk(2, 30, -1, kMinSeq), 0});
  steps.push_back({world.random_chunk(3, 3, -1, kMinSeq), 1});
  world.randomize_topk_all(kMinSeq);
  auto run_and_read = [&](const Step& s) {
    require_ok(ex.run(s.chunk.input(), s.program));
    std::vector<LayerOutputs> outs;
    for (int l : ex.program_layers(s.program)) {
      outs.push_back(test::read_outputs(ex, static_cast<std::size_t>(l), 64));
    }
    return outs;
  };
  std::vector<std::vector<LayerOutputs>> in_order;
  for (const Step& s : steps) in_order.push_back(run_and_read(s));
  for (int i : {3, 1, 0, 2, 1}) {
    INFO("step " << i << " replayed out of order");
    const auto again = run_and_read(steps[static_cast<std::size_t>(i)]);
    const int t_bucket = ex.buckets().t_of(ex.buckets().lookup(static_cast<int>(steps[static_cast<std::size_t>(i)].chunk.requests.size()),
                                                               steps[static_cast<std::size_t>(i)].chunk.tokens()));
    for (std::size_t k = 0; k < again.size(); ++k) {
      // Rows past the chunk's bucket belong to other steps: compare the bucket's rows only.
      const auto l = static_cast<std::size_t>(ex.program_layers(steps[static_cast<std::size_t>(i)].program)[k]);
      const std::size_t h = static_cast<std::size_t>(ex.config().layers[l].h_q);
      const std::size_t rows = static_cast<std::size_t>(t_bucket) * h;
      CHECK(std::equal(again[k].lse.begin(), again[k].lse.begin() + static_cast<std::ptrdiff_t>(rows),
                       in_order[static_cast<std::size_t>(i)][k].lse.begin()));
      CHECK(std::equal(again[k].out.begin(), again[k].out.begin() + static_cast<std::ptrdiff_t>(rows * 512),
                       in_order[static_cast<std::size_t>(i)][k].out.begin()));
    }
  }
  CHECK(ex.read_status().total() == 0);
}

TEST_CASE("1000 back-to-back steps with no host synchronisation match eager results and the reference",
          "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(false));
  ex.warmup();
  World world(ex, 1000);
  // Eight chunks of different shapes and lengths; one set of top-k indices valid for all of them.
  std::vector<ChunkData> variants;
  for (int v = 0; v < 8; ++v) {
    variants.push_back(world.random_chunk(1 + v % 4, 5 + 7 * v, -1, kMinSeq));
  }
  world.randomize_topk_all(kMinSeq);
  const std::size_t l = 0;
  const auto& layer = ex.config().layers[l];
  const std::size_t out_elems = std::size_t{64} * layer.h_q * 512;
  const std::size_t lse_elems = std::size_t{64} * layer.h_q;
  std::vector<LayerOutputs> eager;
  for (const ChunkData& c : variants) {
    require_ok(ex.run_eager(c.input()));
    eager.push_back(test::read_outputs(ex, l, 64));
  }
  constexpr int kSteps = 1000;
  memory::DeviceBuffer aside_out(kSteps * out_elems * 2);
  memory::DeviceBuffer aside_lse(kSteps * lse_elems * 4);
  std::vector<int> order(kSteps);
  for (int i = 0; i < kSteps; ++i) order[static_cast<std::size_t>(i)] = static_cast<int>(world.rng()() % 8);
  const graphs::LayerBuffers& views = ex.layer(l);
  for (int i = 0; i < kSteps; ++i) {
    require_ok(ex.run(variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])].input()));
    SPG_CUDA_TRY(cudaMemcpyAsync(static_cast<std::uint16_t*>(aside_out.data()) + i * out_elems,
                                 views.out.data_handle(), out_elems * 2,
                                 cudaMemcpyDeviceToDevice, ex.stream()));
    SPG_CUDA_TRY(cudaMemcpyAsync(static_cast<float*>(aside_lse.data()) + i * lse_elems,
                                 views.lse.data_handle(), lse_elems * 4,
                                 cudaMemcpyDeviceToDevice, ex.stream()));
  }
  ex.synchronize();
  std::vector<std::uint16_t> out(kSteps * out_elems);
  std::vector<float> lse(kSteps * lse_elems);
  SPG_CUDA_TRY(cudaMemcpy(out.data(), aside_out.data(), out.size() * 2, cudaMemcpyDeviceToHost));
  SPG_CUDA_TRY(cudaMemcpy(lse.data(), aside_lse.data(), lse.size() * 4, cudaMemcpyDeviceToHost));
  int mismatches = 0;
  int first_bad = -1;
  for (int i = 0; i < kSteps; ++i) {
    const LayerOutputs& want = eager[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])];
    const int t_bucket = ex.buckets().t_of(ex.buckets().lookup(
        static_cast<int>(variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])].requests.size()),
        variants[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])].tokens()));
    const std::size_t rows = static_cast<std::size_t>(t_bucket) * layer.h_q;
    const bool same = std::equal(want.out.begin(), want.out.begin() + static_cast<std::ptrdiff_t>(rows * 512),
                                 out.begin() + static_cast<std::ptrdiff_t>(i * out_elems)) &&
                      std::memcmp(want.lse.data(), lse.data() + i * lse_elems, rows * 4) == 0;
    if (!same) {
      ++mismatches;
      if (first_bad < 0) first_bad = i;
    }
  }
  INFO("first mismatching step " << first_bad);
  CHECK(mismatches == 0);
  for (int v : {0, 3, 7}) {
    const auto& c = variants[static_cast<std::size_t>(v)];
    const int b = ex.buckets().lookup(static_cast<int>(c.requests.size()), c.tokens());
    LayerOutputs e = eager[static_cast<std::size_t>(v)];
    const std::size_t rows = static_cast<std::size_t>(ex.buckets().t_of(b)) * layer.h_q;
    e.out.resize(rows * 512);
    e.lse.resize(rows);
    e.max_logits.resize(rows);
    test::check_against_reference(e, world.reference(c, l, ex.buckets().r_of(b), ex.buckets().t_of(b)),
                                  "variant " + std::to_string(v));
  }
}

TEST_CASE("steady state makes zero CUDA allocation calls over 1000 steps", "[gpu][executor]") {
  auto& counter = memory::AllocationCounter::instance();
  CHECK(counter.watched_callbacks() > 10);
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 5);
  std::vector<ChunkData> chunks;
  for (int i = 0; i < 32; ++i) {
    chunks.push_back(world.random_chunk(1 + i % 4, 1 + static_cast<int>(world.rng()() % 64)));
  }
  // The counter sees allocations: one cudaMalloc now counts (runtime and driver).
  counter.reset();
  { memory::DeviceBuffer probe(4096); }
  CHECK(counter.count() >= 2);
  counter.reset();
  for (int i = 0; i < 1000; ++i) require_ok(ex.run(chunks[static_cast<std::size_t>(i % 32)].input()));
  ex.synchronize();
  const auto names = counter.names();
  INFO("allocation calls seen: " << (names.empty() ? std::string("none") : names.front()));
  CHECK(counter.count() == 0);
  CHECK(ex.steps() >= 1000);
}

TEST_CASE("failure paths leave the executor usable", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(false));
  World world(ex, 3);
  const ChunkData c = world.random_chunk(2, 10);
  CHECK(ex.run(c.input()).status == graphs::RunStatus::not_warmed_up);
  ex.warmup();

  SECTION("capturing the legacy default stream is refused with a typed error") {
    CHECK_THROWS_AS(graphs::CaptureGuard(cudaStreamLegacy), StateError);
    CHECK_THROWS_AS(graphs::CaptureGuard(nullptr), StateError);
  }
  SECTION("a stage failing during capture is discarded and a later capture succeeds") {
    memory::Stream s;
    try {
      graphs::CaptureGuard guard(s.get());
      SPG_CUDA_TRY(cudaStreamSynchronize(s.get()));  // illegal while capturing: invalidates the capture
      FAIL("the illegal call did not fail");
    } catch (const CudaError&) {
    }
    cudaStreamCaptureStatus status{};
    REQUIRE(cudaStreamIsCapturing(s.get(), &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusNone);
    const graphs::Pipeline& p = ex.pipeline(0, 0);
    graphs::CaptureGuard guard(s.get());
    REQUIRE(p.record(0, s.get()) == cudaSuccess);
    const graphs::Graph g = guard.finish();
    CHECK(g.node_count() == static_cast<std::size_t>(p.kernel_launches()));
    const graphs::GraphExec exec = graphs::GraphExec::instantiate(g, s.get());
    CHECK(exec.launch(s.get()) == cudaSuccess);
    s.synchronize();
  }
  SECTION("the sealed pool refuses growth") {
    CHECK(ex.pool().sealed());
    CHECK_THROWS_AS(ex.pool().carve(memory::SlotSpec{"late", 256}), StateError);
  }
  SECTION("bad chunks are refused before anything is written") {
    ChunkData big = world.random_chunk(4, 64);
    big.requests.push_back(big.requests.back());
    CHECK(ex.run(big.input()).status == graphs::RunStatus::no_bucket);
    ChunkData bad = world.random_chunk(2, 10);
    bad.requests[1].seq_len = ex.config().max_model_len + 1;
    CHECK(ex.run(bad.input()).status == graphs::RunStatus::bad_chunk);
    ChunkData short_table = world.random_chunk(1, 5);
    short_table.requests[0].swa_blocks = short_table.requests[0].swa_blocks.subspan(0, 0);
    short_table.requests[0].seq_len = std::max(short_table.requests[0].seq_len, 70);
    CHECK(ex.run(short_table.input()).status == graphs::RunStatus::bad_chunk);
    CHECK(ex.run(c.input(), 5).status == graphs::RunStatus::bad_program);
  }
  // Whatever happened above, the executor still runs a good chunk.
  world.randomize_topk(c);
  require_ok(ex.run(c.input()));
  ex.synchronize();
  CHECK(ex.read_status().total() == 0);
}
