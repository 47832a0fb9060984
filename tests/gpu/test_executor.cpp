// The graph executor: graph replay equals eager and the CPU reference for every bucket, zero
// allocations in steady state, padding, out-of-order replay, back-to-back steps without host
// synchronisation, and failure paths that leave it usable.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <utility>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/kernels/kv_cache/kv_cache.hpp"
#include "spgraph/memory/allocation_counter.hpp"

using namespace spg;
using spg::test::ChunkData;
using spg::test::LayerOutputs;
using spg::test::poison_outputs;
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
  INFO("run status: " << graphs::run_status_name(r.status) << ", cuda: " << cudaGetErrorName(r.cuda)
                      << (r.bad_field != nullptr ? std::string(", ") + r.bad_field + ": " + r.bad_reason : std::string()));
  REQUIRE(r.ok());
}

/// NaN elements of a layer's outputs (bf16 out as bits): a run's outputs hold none.
std::size_t nan_count(const LayerOutputs& o) {
  std::size_t n = 0;
  for (const std::uint16_t v : o.out) n += (v & 0x7FFF) > 0x7F80;
  for (const float v : o.lse) n += std::isnan(v);
  for (const float v : o.max_logits) n += std::isnan(v);
  return n;
}

/// The first `rows` rows (tokens x heads) of out, lse and max_logits are bit-identical.
bool same_rows(const LayerOutputs& a, const LayerOutputs& b, std::size_t rows) {
  return std::memcmp(a.out.data(), b.out.data(), rows * 512 * 2) == 0 && std::memcmp(a.lse.data(), b.lse.data(), rows * 4) == 0 &&
         std::memcmp(a.max_logits.data(), b.max_logits.data(), rows * 4) == 0;
}

/// Every cache of every layer copied to the host.
std::vector<std::vector<std::uint8_t>> cache_bytes(graphs::Executor& ex) {
  ex.synchronize();
  std::vector<std::vector<std::uint8_t>> out;
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    for (const graphs::PagedCache* c : {&ex.layer(l).swa_cache, &ex.layer(l).compressed_cache}) {
      if (!graphs::bound(*c)) continue;
      out.emplace_back(c->bytes());
      SPG_CUDA_TRY(cudaMemcpy(out.back().data(), c->data, c->bytes(), cudaMemcpyDeviceToHost));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("graph replay equals eager launches bit for bit and the reference, for every bucket and both staging blocks",
          "[gpu][executor]") {
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
    poison_outputs(ex);
    require_ok(ex.run_eager(c.input()));
    std::vector<LayerOutputs> eager;
    for (int l : layers) {
      eager.push_back(test::read_outputs(ex, static_cast<std::size_t>(l), buckets.t_of(bucket)));
      INFO("layer " << l << ": the eager run left poisoned elements in its bucket's rows");
      CHECK(nan_count(eager.back()) == 0);
    }
    // Two replays: consecutive steps use the two staging blocks, so both of the bucket's graphs
    // run. The outputs are poisoned again before each, so a replay that writes nothing fails.
    bool staging_seen[2] = {false, false};
    for (int replay = 0; replay < 2; ++replay) {
      poison_outputs(ex);
      const int staging = static_cast<int>(ex.steps() & 1);
      staging_seen[staging] = true;
      INFO("replay " << replay << " on staging block " << staging);
      const graphs::RunResult r = ex.run(c.input());
      require_ok(r);
      CHECK(r.bucket == bucket);
      for (std::size_t i = 0; i < layers.size(); ++i) {
        INFO("layer " << layers[i]);
        CHECK(test::read_outputs(ex, static_cast<std::size_t>(layers[i]), buckets.t_of(bucket)) == eager[i]);
      }
    }
    CHECK(staging_seen[0]);
    CHECK(staging_seen[1]);
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
  CHECK(ex.read_run_faults().total() == 0);
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

TEST_CASE("padding is harmless: padded requests and tokens write zeros and +inf and read nothing they must not",
          "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 99);
  const auto& cfg = ex.config();
  const std::vector<int> layers = ex.program_layers(0);
  const auto T = static_cast<std::size_t>(cfg.max_tokens);
  // Shapes below their bucket in requests, tokens or both (buckets R {1, 2, 4} x T {16, 24, 32, 48, 64}).
  const std::pair<int, int> shapes[] = {{1, 1}, {1, 13}, {2, 21}, {3, 33}, {3, 45}, {2, 50}, {4, 61}};
  for (const auto& [n, tokens] : shapes) {
    const ChunkData c = world.random_chunk(n, tokens);
    world.randomize_topk(c);
    const int bucket = ex.buckets().lookup(n, tokens);
    const int r_bucket = ex.buckets().r_of(bucket);
    const int t_bucket = ex.buckets().t_of(bucket);
    INFO(n << " requests, " << tokens << " tokens in bucket R" << r_bucket << " T" << t_bucket);
    REQUIRE((r_bucket > n || t_bucket > tokens));

    // Cache blocks no request of the chunk owns: 0xFF (NaN rows and scales). Nothing may read or write them.
    ex.synchronize();
    struct CacheState {
      graphs::PagedCache cache;
      std::vector<std::uint8_t> before;
      std::vector<bool> owned;
    };
    std::vector<CacheState> caches;
    for (int l : layers) {
      const auto li = static_cast<std::size_t>(l);
      const int ri = graphs::ratio_index(cfg.layers[li].compress_ratio);
      for (const bool compressed : {false, true}) {
        if (compressed && ri == 0) continue;
        CacheState st;
        st.cache = compressed ? ex.layer(li).compressed_cache : ex.layer(li).swa_cache;
        st.before.resize(st.cache.bytes());
        SPG_CUDA_TRY(cudaMemcpy(st.before.data(), st.cache.data, st.before.size(), cudaMemcpyDeviceToHost));
        st.owned.assign(static_cast<std::size_t>(st.cache.layout.num_blocks), false);
        for (std::size_t b = 0; b < c.requests.size(); ++b) {
          for (const std::int32_t id : compressed ? c.compressed_blocks[ri][b] : c.swa_blocks[b]) {
            st.owned[static_cast<std::size_t>(id)] = true;
          }
        }
        std::vector<std::uint8_t> poisoned = st.before;
        for (std::size_t blk = 0; blk < st.owned.size(); ++blk) {
          if (!st.owned[blk]) {
            std::memset(poisoned.data() + blk * static_cast<std::size_t>(st.cache.layout.block_stride), 0xFF,
                        static_cast<std::size_t>(st.cache.layout.block_stride));
          }
        }
        SPG_CUDA_TRY(cudaMemcpy(st.cache.data, poisoned.data(), poisoned.size(), cudaMemcpyHostToDevice));
        caches.push_back(std::move(st));
      }
    }
    // q rows of the padded tokens: NaN (kept to restore them for the next shape).
    std::vector<std::vector<std::uint16_t>> q_saved;
    for (int l : layers) {
      const graphs::LayerBuffers& v = ex.layer(static_cast<std::size_t>(l));
      q_saved.push_back(test::download_rows<std::uint16_t>(v.q, T));
      const std::size_t row = v.q.extent(1) * v.q.extent(2) * 2;
      SPG_CUDA_TRY(cudaMemset2D(v.q.data_handle() + static_cast<std::size_t>(tokens) * v.q.stride(0), v.q.stride(0) * 2,
                                0xFF, row, T - static_cast<std::size_t>(tokens)));
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());

    world.apply_insert(c, layers);
    std::vector<test::ref::SparseMlaReferenceOutputs> want;
    for (int l : layers) want.push_back(world.reference(c, static_cast<std::size_t>(l), r_bucket, t_bucket));

    for (const bool graph : {false, true}) {
      INFO((graph ? "replayed" : "eager"));
      // Workspaces and outputs poisoned; the staging blocks too, so that metadata the encoder does
      // not write for this chunk (other requests' table rows, slots past its tokens) is a block id
      // and a slot far outside every cache: a kernel that read one would count a fault.
      test::poison(ex.workspace().kv);
      test::poison(ex.workspace().combined_indices);
      test::poison(ex.workspace().combined_lens);
      poison_outputs(ex);
      for (const char* staging : graphs::slots::kStaging) {
        std::memset(ex.pool().bytes(staging, ex.pool().slot_bytes(staging)), 0x7F, ex.pool().slot_bytes(staging));
      }
      const graphs::RunResult r = graph ? ex.run(c.input()) : ex.run_eager(c.input());
      require_ok(r);
      REQUIRE(r.bucket == bucket);
      for (std::size_t i = 0; i < layers.size(); ++i) {
        const auto li = static_cast<std::size_t>(layers[i]);
        INFO("layer " << li);
        const LayerOutputs got = test::read_outputs(ex, li, t_bucket);
        const std::size_t h = static_cast<std::size_t>(cfg.layers[li].h_q);
        std::size_t bad_padding = 0;
        for (std::size_t k = static_cast<std::size_t>(tokens) * h; k < got.lse.size(); ++k) {
          bad_padding += got.lse[k] != std::numeric_limits<float>::infinity();
          bad_padding += got.max_logits[k] != -std::numeric_limits<float>::infinity();
        }
        for (std::size_t k = static_cast<std::size_t>(tokens) * h * 512; k < got.out.size(); ++k) bad_padding += got.out[k] != 0;
        CHECK(bad_padding == 0);
        test::check_against_reference(got, want[i], "layer " + std::to_string(li));
      }
      const kernels::StepStatus status = ex.read_status();
      INFO("faults: first kind " << status.first.kind << ", request " << status.first.request << ", position "
                                 << status.first.position << ", value " << status.first.value);
      CHECK(status.total() == 0);
      // The unowned blocks came back exactly as poisoned: nothing wrote them.
      for (CacheState& st : caches) {
        std::vector<std::uint8_t> after(st.before.size());
        SPG_CUDA_TRY(cudaMemcpy(after.data(), st.cache.data, after.size(), cudaMemcpyDeviceToHost));
        std::size_t touched = 0;
        for (std::size_t blk = 0; blk < st.owned.size(); ++blk) {
          if (st.owned[blk]) continue;
          const std::uint8_t* p = after.data() + blk * static_cast<std::size_t>(st.cache.layout.block_stride);
          for (std::int64_t k = 0; k < st.cache.layout.block_stride; ++k) touched += p[k] != 0xFF;
        }
        CHECK(touched == 0);
      }
    }
    // Restore what the next shape's reference assumes: the unowned blocks and the q rows.
    for (CacheState& st : caches) {
      std::vector<std::uint8_t> after(st.before.size());
      SPG_CUDA_TRY(cudaMemcpy(after.data(), st.cache.data, after.size(), cudaMemcpyDeviceToHost));
      for (std::size_t blk = 0; blk < st.owned.size(); ++blk) {
        if (st.owned[blk]) continue;
        const std::size_t stride = static_cast<std::size_t>(st.cache.layout.block_stride);
        std::memcpy(after.data() + blk * stride, st.before.data() + blk * stride, stride);
      }
      SPG_CUDA_TRY(cudaMemcpy(st.cache.data, after.data(), after.size(), cudaMemcpyHostToDevice));
    }
    for (std::size_t i = 0; i < layers.size(); ++i) {
      test::upload_rows(ex.layer(static_cast<std::size_t>(layers[i])).q, q_saved[i].data(), T);
    }
    SPG_CUDA_TRY(cudaDeviceSynchronize());
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
  auto t_bucket_of = [&](const Step& s) {
    return ex.buckets().t_of(ex.buckets().lookup(static_cast<int>(s.chunk.requests.size()), s.chunk.tokens()));
  };
  // Every run starts from poisoned outputs: a replay that runs nothing (the first one included)
  // leaves NaN where the in-order run wrote values.
  auto run_and_read = [&](const Step& s) {
    poison_outputs(ex);
    require_ok(ex.run(s.chunk.input(), s.program));
    std::vector<LayerOutputs> outs;
    for (int l : ex.program_layers(s.program)) {
      outs.push_back(test::read_outputs(ex, static_cast<std::size_t>(l), 64));
    }
    return outs;
  };
  std::vector<std::vector<LayerOutputs>> in_order;
  for (const Step& s : steps) {
    in_order.push_back(run_and_read(s));
    const std::size_t rows = static_cast<std::size_t>(t_bucket_of(s));
    for (std::size_t k = 0; k < in_order.back().size(); ++k) {
      const auto l = static_cast<std::size_t>(ex.program_layers(s.program)[k]);
      LayerOutputs bucket_rows = in_order.back()[k];
      const std::size_t h = static_cast<std::size_t>(ex.config().layers[l].h_q);
      bucket_rows.out.resize(rows * h * 512);
      bucket_rows.lse.resize(rows * h);
      bucket_rows.max_logits.resize(rows * h);
      INFO("in-order step, layer " << l);
      CHECK(nan_count(bucket_rows) == 0);
    }
  }
  for (int i : {3, 1, 0, 2, 1}) {
    INFO("step " << i << " replayed out of order");
    const Step& s = steps[static_cast<std::size_t>(i)];
    const auto again = run_and_read(s);
    const int t_bucket = t_bucket_of(s);
    for (std::size_t k = 0; k < again.size(); ++k) {
      // Rows past the chunk's bucket belong to other steps: compare the bucket's rows only.
      const auto l = static_cast<std::size_t>(ex.program_layers(s.program)[k]);
      INFO("layer " << l);
      const std::size_t h = static_cast<std::size_t>(ex.config().layers[l].h_q);
      CHECK(same_rows(again[k], in_order[static_cast<std::size_t>(i)][k], static_cast<std::size_t>(t_bucket) * h));
    }
  }
  CHECK(ex.read_status().total() == 0);
  CHECK(ex.read_run_faults().total() == 0);
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
  core::DeviceBuffer aside_out(kSteps * out_elems * 2);
  core::DeviceBuffer aside_lse(kSteps * lse_elems * 4);
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

TEST_CASE("steady state makes zero CUDA allocation calls over 10000 steps", "[gpu][executor]") {
  auto& counter = memory::AllocationCounter::instance();
  CHECK(counter.watched_callbacks() > 10);
  // Beyond cudaMalloc*/cuMemAlloc*: pinning host memory, virtual memory, pools, graph memory nodes.
  const std::vector<std::string>& watched = counter.watched_names();
  for (const char* name : {"cudaMalloc", "cudaMallocAsync", "cudaHostAlloc", "cudaHostRegister", "cudaMemPoolCreate",
                           "cudaGraphAddMemAllocNode", "cuMemAlloc", "cuMemHostRegister", "cuMemMap",
                           "cuMemAddressReserve", "cuMemCreate", "cuMemPoolCreate", "cuGraphAddMemAllocNode"}) {
    INFO(name << " is not watched");
    CHECK(std::any_of(watched.begin(), watched.end(), [&](const std::string& w) { return w.rfind(name, 0) == 0; }));
  }
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 5);
  std::vector<ChunkData> chunks;
  for (int i = 0; i < 32; ++i) {
    chunks.push_back(world.random_chunk(1 + i % 4, 1 + static_cast<int>(world.rng()() % 64)));
  }
  // The counter sees allocations: one cudaMalloc now counts (runtime and driver), and so does
  // pinning host memory.
  counter.reset();
  { core::DeviceBuffer probe(4096); }
  CHECK(counter.count() >= 2);
  counter.reset();
  {
    std::vector<char> host(1 << 16);
    REQUIRE(cudaHostRegister(host.data(), host.size(), cudaHostRegisterDefault) == cudaSuccess);
    REQUIRE(cudaHostUnregister(host.data()) == cudaSuccess);
  }
  CHECK(counter.count() >= 2);
  counter.reset();
  constexpr int kSteps = 10000;
  for (int i = 0; i < kSteps; ++i) {
    const graphs::RunResult r = ex.run(chunks[static_cast<std::size_t>(i % 32)].input());
    if (!r.ok()) require_ok(r);  // REQUIRE only on failure: 10000 assertions would dominate the run
  }
  ex.synchronize();
  const auto names = counter.names();
  INFO("allocation calls seen: " << (names.empty() ? std::string("none") : names.front()));
  CHECK(counter.count() == 0);
  CHECK(ex.steps() >= static_cast<std::uint64_t>(kSteps));
  CHECK(ex.read_run_faults().total() == 0);
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
    core::Stream s;
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

TEST_CASE("a failed warm-up leaves the executor as before, and a second warm-up succeeds", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  World world(ex, 17);
  const ChunkData c = world.random_chunk(3, 40);
  world.randomize_topk(c);
  const std::size_t pool_bytes = ex.pool().device_bytes();
  // The failure is injected without a hook: the executor's own stream is already capturing (the
  // caller's capture, relaxed mode) when warm-up starts. Its eager pass is then captured rather
  // than run, and the stream synchronization that ends the pass fails (and invalidates the
  // capture): warm-up throws after it has carved the attention workspace and built every recording.
  REQUIRE(cudaStreamBeginCapture(ex.stream(), cudaStreamCaptureModeRelaxed) == cudaSuccess);
  bool threw = false;
  try {
    (void)ex.warmup();
  } catch (const Error& e) {
    threw = true;
    INFO(e.what());
    CHECK(std::string(e.what()).find("CUDA call") != std::string::npos);
  }
  CHECK(threw);
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(ex.stream(), &partial);  // invalidated: an error, maybe a graph
  if (partial != nullptr) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
  cudaStreamCaptureStatus capturing{};
  REQUIRE(cudaStreamIsCapturing(ex.stream(), &capturing) == cudaSuccess);
  REQUIRE(capturing == cudaStreamCaptureStatusNone);
  // As before the call: not warmed up, the pool unsealed and no larger.
  CHECK(ex.run(c.input()).status == graphs::RunStatus::not_warmed_up);
  CHECK_FALSE(ex.pool().sealed());
  CHECK(ex.pool().device_bytes() == pool_bytes);

  const graphs::WarmupReport report = ex.warmup();  // was "slot 'attention_workspace' is already in the plan"
  CHECK(report.graphs == 2 * ex.buckets().size());
  CHECK(report.pool_allocation_calls == 2);  // the retry allocated nothing more
  CHECK(ex.pool().device_bytes() == pool_bytes);
  CHECK(ex.pool().sealed());
  CHECK_THROWS_AS(ex.warmup(), StateError);
  poison_outputs(ex);
  const graphs::RunResult r = ex.run(c.input());
  require_ok(r);
  world.apply_insert(c, ex.program_layers(0));
  for (int l : ex.program_layers(0)) {
    const auto li = static_cast<std::size_t>(l);
    test::check_against_reference(test::read_outputs(ex, li, ex.buckets().t_of(r.bucket)),
                                  world.reference(c, li, ex.buckets().r_of(r.bucket), ex.buckets().t_of(r.bucket)),
                                  "layer " + std::to_string(l));
  }
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("faults are counted over the whole run, not only the last step", "[gpu][executor]") {
  // Issue 17: StepStatus is zeroed by every step's stage-in, so a fault was visible only until the
  // next step. The stage-in now folds each step's counts into the run's totals first.
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 23);
  CHECK(ex.read_run_faults().total() == 0);  // warm-up's steps are clean
  const ChunkData c = world.random_chunk(2, 20, -1, kMinSeq);
  auto inject = [&] {
    // Three top-k indices of token 0 in layer 0 (C4A) past every row: the combine counts each.
    world.randomize_topk(c);
    const std::int32_t bad[3] = {1 << 30, 1 << 29, 1 << 28};
    SPG_CUDA_TRY(cudaMemcpy(ex.layer(0).topk_indices.data_handle(), bad, sizeof bad, cudaMemcpyHostToDevice));
  };
  inject();
  require_ok(ex.run(c.input()));
  kernels::StepStatus step = ex.read_status();
  CHECK(step.count(kernels::Fault::topk_index) == 3);
  world.randomize_topk(c);
  for (int i = 0; i < 4; ++i) require_ok(i % 2 == 0 ? ex.run(c.input()) : ex.run_eager(c.input()));
  step = ex.read_status();
  CHECK(step.total() == 0);  // the last step alone shows nothing
  kernels::RunFaults run = ex.read_run_faults();
  CHECK(run.total() == 3);
  CHECK(run.count(kernels::Fault::topk_index) == 3);
  CHECK(run.faulty_steps == 1);
  REQUIRE(run.recorded == 1);
  CHECK(run.first.kind == static_cast<std::int32_t>(kernels::Fault::topk_index));
  CHECK(run.first.position == 0);  // token 0
  // A second faulty step, eager this time, and the last one: it counts without a stage-in after it.
  inject();
  require_ok(ex.run_eager(c.input()));
  run = ex.read_run_faults();
  CHECK(run.count(kernels::Fault::topk_index) == 6);
  CHECK(run.faulty_steps == 2);
  CHECK(run.first.value == (1 << 30));  // still the run's first fault
  world.randomize_topk(c);
  require_ok(ex.run(c.input()));
  CHECK(ex.read_run_faults().count(kernels::Fault::topk_index) == 6);
}

TEST_CASE("empty work: a chunk of no requests, or of requests with no new tokens, returns cleanly", "[gpu][executor]") {
  graphs::Executor ex(test::small_program(), options(true));
  ex.warmup();
  World world(ex, 31);
  const std::vector<std::vector<std::uint8_t>> caches = cache_bytes(ex);
  const ChunkData no_tokens = world.random_chunk(2, 0);  // two requests, query_len 0 each
  REQUIRE(no_tokens.tokens() == 0);
  REQUIRE(no_tokens.requests[0].seq_len + no_tokens.requests[1].seq_len > 0);
  const graphs::ChunkInput inputs[] = {graphs::ChunkInput{}, no_tokens.input()};
  for (const graphs::ChunkInput& in : inputs) {
    for (const bool graph : {false, true}) {
      INFO(in.requests.size() << " requests, " << (graph ? "replayed" : "eager"));
      poison_outputs(ex);
      const graphs::RunResult r = graph ? ex.run(in) : ex.run_eager(in);
      require_ok(r);
      CHECK(ex.buckets().r_of(r.bucket) >= static_cast<int>(in.requests.size()));
      const int t_bucket = ex.buckets().t_of(r.bucket);
      CHECK(t_bucket == ex.buckets().t_buckets().front());
      // Every row of the bucket is padding: empty rows, written (the poison is gone).
      for (int l : ex.program_layers(0)) {
        INFO("layer " << l);
        const LayerOutputs got = test::read_outputs(ex, static_cast<std::size_t>(l), t_bucket);
        std::size_t bad = 0;
        for (const std::uint16_t v : got.out) bad += v != 0;
        for (const float v : got.lse) bad += v != std::numeric_limits<float>::infinity();
        for (const float v : got.max_logits) bad += v != -std::numeric_limits<float>::infinity();
        CHECK(bad == 0);
      }
      CHECK(ex.read_status().total() == 0);
    }
  }
  const bool caches_unchanged = cache_bytes(ex) == caches;  // a bool: Catch would print whole caches
  CHECK(caches_unchanged);
  CHECK(ex.read_run_faults().total() == 0);
}
