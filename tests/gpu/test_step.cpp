// Steps in one graph launch (src/spgraph/graphs/step.hpp, docs/graphs.md "Steps"): a step of k chunks, run as
// one step-graph launch or as the eager host loop, over step-sized buffers, leaves exactly what k
// single-chunk runs leave, each on its chunk's rows of the step's inputs (every layer's outputs at
// the chunk's rows and every cache, bit for bit, outputs NaN-poisoned before each run; rows past
// the step's tokens untouched); the step graph holds the expected nodes; steps of any size
// alternate on the graphs warm-up captured; a step of no chunks does nothing; steady state makes
// no allocation call.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "executor_test_util.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/graph.hpp"
#include "spgraph/graphs/pipeline.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/memory/allocation_counter.hpp"

using namespace spg;
using spg::test::LayerOutputs;
using spg::test::poison_outputs;
using spg::test::World;

namespace {

constexpr int kStepRequests = 64;
constexpr int kStepTokens = 1024;  // 16 chunks of T = 64
constexpr int kMinPrefix = 256;    // every piece's seq_len > 256: one set of top-k indices fits all

/// small_program() (R = 4, T = 64; C4A, SWA-only, C128A) with caches large enough for 64 requests.
model::PipelineConfig step_program() {
  model::PipelineConfig c = test::small_program();
  c.cache.swa_blocks = 521;        // 64 requests of up to 453 tokens: 8 blocks each
  c.cache.compressed_blocks = 131;  // 2 each
  return c;
}

graphs::ExecutorOptions step_options(bool capture = true, int flat_step_chunks = 0) {
  graphs::ExecutorOptions o;
  o.capture = capture;
  o.flat_step_chunks = flat_step_chunks;
  o.programs = {{0, 1, 2}, {2}};
  o.max_step_requests = kStepRequests;
  o.max_step_tokens = kStepTokens;
  return o;
}

void require_ok(const graphs::RunResult& r) {
  INFO("run status: " << graphs::run_status_name(r.status) << ", cuda: " << cudaGetErrorName(r.cuda)
                      << (r.bad_field != nullptr ? std::string(", ") + r.bad_field + ": " + r.bad_reason : std::string())
                      << ", chunk " << r.bad_chunk << ", request " << r.bad_request);
  REQUIRE(r.ok());
}

/// One step's requests with distinct cache blocks (owning).
struct StepData {
  std::vector<graphs::RequestInput> requests;
  std::vector<std::vector<std::int32_t>> swa;
  std::vector<std::vector<std::int32_t>> compressed[graphs::kNumRatios];
  graphs::StepInput input() const { return graphs::StepInput{requests}; }
};

StepData make_step(const model::PipelineConfig& cfg, const std::vector<int>& query_lens, std::mt19937_64& rng) {
  StepData s;
  std::vector<std::int32_t> swa_free(static_cast<std::size_t>(cfg.cache.swa_blocks));
  std::iota(swa_free.begin(), swa_free.end(), 0);
  std::shuffle(swa_free.begin(), swa_free.end(), rng);
  std::vector<std::int32_t> c_free[graphs::kNumRatios];
  std::size_t swa_next = 0;
  std::size_t c_next[graphs::kNumRatios] = {0, 0, 0};
  for (int i = 1; i < graphs::kNumRatios; ++i) {
    c_free[i].resize(static_cast<std::size_t>(cfg.cache.compressed_blocks));
    std::iota(c_free[i].begin(), c_free[i].end(), 0);
    std::shuffle(c_free[i].begin(), c_free[i].end(), rng);
  }
  s.requests.resize(query_lens.size());
  s.swa.resize(query_lens.size());
  for (int i = 1; i < graphs::kNumRatios; ++i) s.compressed[i].resize(query_lens.size());
  for (std::size_t b = 0; b < query_lens.size(); ++b) {
    graphs::RequestInput& r = s.requests[b];
    r.query_len = query_lens[b];
    r.seq_len = kMinPrefix + static_cast<int>(rng() % 64) + r.query_len;
    const auto swa_need = static_cast<std::size_t>((r.seq_len + cfg.cache.swa_block_size - 1) / cfg.cache.swa_block_size);
    REQUIRE(swa_next + swa_need <= swa_free.size());
    s.swa[b].assign(swa_free.begin() + static_cast<std::ptrdiff_t>(swa_next),
                    swa_free.begin() + static_cast<std::ptrdiff_t>(swa_next + swa_need));
    swa_next += swa_need;
    const auto c_need = static_cast<std::size_t>((r.seq_len + cfg.cache.block_tokens - 1) / cfg.cache.block_tokens);
    for (int i = 1; i < graphs::kNumRatios; ++i) {
      REQUIRE(c_next[i] + c_need <= c_free[i].size());
      s.compressed[i][b].assign(c_free[i].begin() + static_cast<std::ptrdiff_t>(c_next[i]),
                                c_free[i].begin() + static_cast<std::ptrdiff_t>(c_next[i] + c_need));
      c_next[i] += c_need;
    }
  }
  for (std::size_t b = 0; b < s.requests.size(); ++b) {
    s.requests[b].swa_blocks = s.swa[b];
    for (int i = 1; i < graphs::kNumRatios; ++i) s.requests[b].compressed_blocks[i] = s.compressed[i][b];
  }
  return s;
}

/// A random step that splits into exactly k chunks: a mix of one-token, short, T-token (a chunk of
/// one request at the bucket maximum) and longer-than-T requests (continued into the next chunk).
StepData step_of(const model::PipelineConfig& cfg, graphs::StepSplitter& splitter, int k, std::mt19937_64& rng) {
  if (k == 0) return StepData{};
  for (int attempt = 0; attempt < 10000; ++attempt) {
    std::vector<int> lens;
    int tokens = 0;
    while (static_cast<int>(lens.size()) < kStepRequests) {
      int q = 0;
      switch (rng() % 5) {
        case 0: q = 1; break;
        case 1: q = 1 + static_cast<int>(rng() % 8); break;
        case 2: q = cfg.max_tokens; break;
        case 3: q = cfg.max_tokens + 1 + static_cast<int>(rng() % 70); break;
        default: q = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(cfg.max_tokens)); break;
      }
      if (tokens + q > kStepTokens) break;
      lens.push_back(q);
      tokens += q;
      std::vector<graphs::RequestInput> probe(lens.size());
      for (std::size_t b = 0; b < lens.size(); ++b) probe[b].query_len = probe[b].seq_len = lens[b];
      const int chunks = splitter.split(graphs::StepInput{probe}).chunks;
      if (chunks == k && rng() % 3 == 0) return make_step(cfg, lens, rng);
      if (chunks > k) break;
    }
  }
  FAIL("no random step of " << k << " chunks found");
  return StepData{};
}

/// A random step that splits into exactly k full chunks (cfg.max_tokens tokens each): chunks of
/// one request of T tokens, of 2 .. R requests that sum to T, or two chunks of one 2T request.
StepData full_step_of(const model::PipelineConfig& cfg, graphs::StepSplitter& splitter, int k, std::mt19937_64& rng) {
  const int t = cfg.max_tokens;
  std::vector<int> lens;
  for (int chunks = 0; chunks < k;) {
    const int kind = static_cast<int>(rng() % 3);
    if (kind == 2 && chunks + 2 <= k) {
      lens.push_back(2 * t);
      chunks += 2;
      continue;
    }
    const int n = kind == 0 ? 1 : 2 + static_cast<int>(rng() % static_cast<std::uint64_t>(cfg.max_requests - 1));
    int left = t;
    for (int i = 0; i < n - 1; ++i) {
      const int q = 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(left - (n - 1 - i)));
      lens.push_back(q);
      left -= q;
    }
    lens.push_back(left);
    ++chunks;
  }
  StepData s = make_step(cfg, lens, rng);
  const graphs::StepSplit split = splitter.split(s.input());
  REQUIRE(split.chunks == k);
  for (int c = 0; c < k; ++c) REQUIRE(splitter.chunk(c).num_tokens() == t);
  return s;
}

/// Whether every chunk of `s` is full as the stager counts it: its bucket has the largest T.
bool is_all_full(const graphs::Executor& ex, graphs::StepSplitter& splitter, const StepData& s) {
  const graphs::StepSplit split = splitter.split(s.input());
  bool all_full = true;
  for (int c = 0; c < split.chunks; ++c) {
    const graphs::ChunkInput in = splitter.chunk(c);
    const int b = ex.buckets().lookup(static_cast<int>(in.requests.size()), static_cast<int>(in.num_tokens()));
    all_full = all_full && ex.buckets().t_of(b) == ex.buckets().t_buckets().back();
  }
  return all_full;
}

/// Every layer's caches, bytes on the host.
struct Caches {
  std::vector<std::vector<std::uint8_t>> bytes;
  bool operator==(const Caches&) const = default;
};

Caches read_caches(graphs::Executor& ex) {
  ex.synchronize();
  Caches c;
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    for (const graphs::PagedCache* cache : {&ex.layer(l).swa_cache, &ex.layer(l).compressed_cache}) {
      if (!graphs::bound(*cache)) continue;
      std::vector<std::uint8_t> host(cache->layout.bytes());
      SPG_CUDA_TRY(cudaMemcpy(host.data(), cache->data, host.size(), cudaMemcpyDeviceToHost));
      c.bytes.push_back(std::move(host));
    }
  }
  return c;
}

void write_caches(graphs::Executor& ex, const Caches& c) {
  ex.synchronize();
  std::size_t i = 0;
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    for (const graphs::PagedCache* cache : {&ex.layer(l).swa_cache, &ex.layer(l).compressed_cache}) {
      if (!graphs::bound(*cache)) continue;
      SPG_CUDA_TRY(cudaMemcpy(cache->data, c.bytes[i].data(), c.bytes[i].size(), cudaMemcpyHostToDevice));
      ++i;
    }
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());
}

/// What a run leaves: every layer's outputs (every row of the step-sized buffers) and every cache.
struct State {
  std::vector<LayerOutputs> outputs;
  Caches caches;
  bool operator==(const State& o) const { return outputs == o.outputs && caches == o.caches; }
};

std::size_t output_rows(graphs::Executor& ex, std::size_t l) { return ex.layer(l).out.extent(0); }

State read_state(graphs::Executor& ex) {
  State s;
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    s.outputs.push_back(test::read_outputs(ex, l, static_cast<int>(output_rows(ex, l))));
  }
  s.caches = read_caches(ex);
  return s;
}

/// A step's inputs, every row of the step-sized buffers: q, top-k (valid for any request of at
/// least kMinPrefix tokens), K rows and compressed K rows, random per row, per layer.
struct StepRows {
  std::vector<std::vector<std::uint16_t>> q, k_rows, compressed_k_rows;
  std::vector<std::vector<std::int32_t>> topk;
};

StepRows random_rows(graphs::Executor& ex, std::mt19937_64& rng) {
  const model::PipelineConfig& cfg = ex.config();
  StepRows in;
  const std::size_t L = cfg.layers.size();
  in.q.resize(L);
  in.k_rows.resize(L);
  in.compressed_k_rows.resize(L);
  in.topk.resize(L);
  for (std::size_t l = 0; l < L; ++l) {
    const graphs::LayerBuffers& v = ex.layer(l);
    const model::LayerConfig& layer = cfg.layers[l];
    in.q[l].resize(v.q.extent(0) * v.q.extent(1) * v.q.extent(2));
    for (auto& x : in.q[l]) x = test::random_bf16(rng, 1.0F);
    in.k_rows[l].resize(v.k_rows.extent(0) * model::kHeadDim);
    for (auto& x : in.k_rows[l]) x = test::random_bf16(rng, 0.1F);
    if (layer.compress_ratio == 1) continue;
    in.compressed_k_rows[l].resize(v.compressed_k_rows.extent(0) * model::kHeadDim);
    for (auto& x : in.compressed_k_rows[l]) x = test::random_bf16(rng, 0.05F);
    const int rows = kMinPrefix / layer.compress_ratio;
    in.topk[l].resize(v.topk_indices.extent(0) * static_cast<std::size_t>(layer.top_k));
    for (auto& x : in.topk[l]) {
      x = rng() % 10 == 0 ? -1 : static_cast<std::int32_t>(rng() % static_cast<std::uint64_t>(rows));
    }
  }
  return in;
}

/// Uploads rows [first, first + count) of every layer's inputs into rows [0, count) of the
/// executor's buffers (compressed K rows: `compressed[ratio index]` rows from `compressed_first`).
void upload_rows(graphs::Executor& ex, const StepRows& in, std::size_t first, std::size_t count,
                 const std::size_t (&compressed_first)[graphs::kNumRatios],
                 const std::size_t (&compressed)[graphs::kNumRatios]) {
  ex.synchronize();
  const model::PipelineConfig& cfg = ex.config();
  for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
    const graphs::LayerBuffers& v = ex.layer(l);
    const model::LayerConfig& layer = cfg.layers[l];
    const std::size_t q_row = v.q.extent(1) * v.q.extent(2);
    test::upload_rows(v.q, in.q[l].data() + first * q_row, count);
    test::upload_rows(v.k_rows, in.k_rows[l].data() + first * model::kHeadDim, count);
    if (layer.compress_ratio == 1) continue;
    const int i = graphs::ratio_index(layer.compress_ratio);
    test::upload_rows(v.topk_indices, in.topk[l].data() + first * static_cast<std::size_t>(layer.top_k), count);
    test::upload_rows(v.compressed_k_rows, in.compressed_k_rows[l].data() + compressed_first[i] * model::kHeadDim,
                      compressed[i]);
  }
  SPG_CUDA_TRY(cudaDeviceSynchronize());  // pageable copies ran on the legacy stream
}

/// Every row of the inputs to rows 0 .. of the buffers: what a step reads.
void upload_step_rows(graphs::Executor& ex, const StepRows& in) {
  std::size_t compressed[graphs::kNumRatios] = {0, 0, 0};
  for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
    const int r = ex.config().layers[l].compress_ratio;
    if (r > 1) compressed[graphs::ratio_index(r)] = ex.layer(l).compressed_k_rows.extent(0);
  }
  const std::size_t none[graphs::kNumRatios] = {0, 0, 0};
  upload_rows(ex, in, 0, ex.layer(0).q.extent(0), none, compressed);
}

/// What the cases that compare steps with their chunks start from: random caches and layer inputs
/// (World), those caches as read back, the executor's split, and random step rows uploaded.
struct StepStart {
  StepStart(graphs::Executor& ex, std::uint64_t seed)
      : world(ex, seed), caches(read_caches(ex)), splitter(ex.config(), ex.step_layout()), rows(random_rows(ex, world.rng())) {
    upload_step_rows(ex, rows);
  }
  World world;
  Caches caches;
  graphs::StepSplitter splitter;
  StepRows rows;
};

enum class How { chunks, step_eager, step_graph };

/// From the caches `start`, with the outputs poisoned: the step `s` over the inputs `in`, run `how`.
/// How::chunks is the reference: each chunk run alone (run(chunk)) on its rows of the step's
/// inputs, uploaded to rows from 0, and its outputs' rows [0, tokens) put at the chunk's rows of
/// the step; rows past the step's tokens stay poisoned.
State run_from(graphs::Executor& ex, graphs::StepSplitter& splitter, const Caches& start, const StepData& s,
               const StepRows& in, int program, How how) {
  write_caches(ex, start);
  poison_outputs(ex);
  if (how == How::chunks) {
    State want = read_state(ex);  // poison everywhere
    const graphs::StepSplit split = splitter.split(s.input());
    REQUIRE(split.status == graphs::RunStatus::ok);
    std::size_t token = 0;
    std::size_t row[graphs::kNumRatios] = {0, 0, 0};
    for (int c = 0; c < split.chunks; ++c) {
      const graphs::ChunkInput chunk = splitter.chunk(c);
      const auto tokens = static_cast<std::size_t>(chunk.num_tokens());
      std::size_t rows[graphs::kNumRatios] = {0, 0, 0};
      for (const graphs::RequestInput& r : chunk.requests) {
        for (int i = 1; i < graphs::kNumRatios; ++i) {
          rows[i] += static_cast<std::size_t>(graphs::new_compressed_rows(r.seq_len, r.query_len, graphs::kRatios[i]));
        }
      }
      upload_rows(ex, in, token, tokens, row, rows);
      require_ok(ex.run(chunk, program));
      for (std::size_t l = 0; l < ex.config().layers.size(); ++l) {
        const LayerOutputs got = test::read_outputs(ex, l, static_cast<int>(tokens));
        LayerOutputs& w = want.outputs[l];
        const std::size_t h = static_cast<std::size_t>(ex.config().layers[l].h_q);
        std::copy(got.out.begin(), got.out.end(), w.out.begin() + static_cast<std::ptrdiff_t>(token * h * 512));
        std::copy(got.lse.begin(), got.lse.end(), w.lse.begin() + static_cast<std::ptrdiff_t>(token * h));
        std::copy(got.max_logits.begin(), got.max_logits.end(),
                  w.max_logits.begin() + static_cast<std::ptrdiff_t>(token * h));
      }
      token += tokens;
      for (int i = 1; i < graphs::kNumRatios; ++i) row[i] += rows[i];
    }
    want.caches = read_caches(ex);
    upload_step_rows(ex, in);  // the step's inputs back in place
    return want;
  }
  const graphs::RunResult r = how == How::step_graph ? ex.run(s.input(), program) : ex.run_eager(s.input(), program);
  require_ok(r);
  CHECK(r.chunks == splitter.split(s.input()).chunks);
  return read_state(ex);
}

}  // namespace

TEST_CASE("a step of k chunks in one launch writes each chunk's rows as k single-chunk runs do, bit for bit",
          "[gpu][step]") {
  const model::PipelineConfig cfg = step_program();
  graphs::Executor ex(cfg, step_options());
  const std::uint64_t before_warmup = graphs::GraphExec::instantiations();
  const graphs::WarmupReport report = ex.warmup();
  CHECK(report.step_graphs == 2 * ex.programs());
  CHECK(report.one_chunk_step_graphs == 2 * ex.programs() * ex.buckets().size());
  // Every graph warm-up reports was instantiated, and the counter saw each: it counts.
  const std::uint64_t after_warmup = graphs::GraphExec::instantiations();
  CHECK(after_warmup - before_warmup ==
        static_cast<std::uint64_t>(report.graphs + report.step_graphs + report.one_chunk_step_graphs +
                                   report.flat_step_graphs + report.staged_step_graphs +
                                   report.staged_one_chunk_graphs));
  // The buffers hold a whole step: max_step_tokens rows, and S / r + Q compressed K rows.
  for (std::size_t l = 0; l < cfg.layers.size(); ++l) {
    CHECK(ex.layer(l).q.extent(0) == static_cast<std::size_t>(kStepTokens));
    CHECK(ex.layer(l).out.extent(0) == static_cast<std::size_t>(kStepTokens));
    const int r = cfg.layers[l].compress_ratio;
    if (r > 1) CHECK(ex.layer(l).compressed_k_rows.extent(0) == static_cast<std::size_t>(kStepTokens / r + kStepRequests));
  }
  StepStart at(ex, 17);
  auto& [world, start, splitter, rows] = at;
  std::mt19937_64& rng = world.rng();

  // k = 1 .. 16 in a shuffled order: steps of different sizes follow each other on the graphs
  // warm-up captured (the executor never captures after warm-up: no graph is instantiated
  // between warm-up and the end of the loop).
  std::vector<int> ks(16);
  std::iota(ks.begin(), ks.end(), 1);
  std::shuffle(ks.begin(), ks.end(), rng);
  std::set<int> buckets_seen;
  int one_request_chunks = 0;
  int full_chunks = 0;
  for (const int k : ks) {
    const StepData s = step_of(cfg, splitter, k, rng);
    const graphs::StepSplit split = splitter.split(s.input());
    REQUIRE(split.chunks == k);
    for (int c = 0; c < k; ++c) {
      const graphs::ChunkInput in = splitter.chunk(c);
      buckets_seen.insert(ex.buckets().lookup(static_cast<int>(in.requests.size()), static_cast<int>(in.num_tokens())));
      one_request_chunks += in.requests.size() == 1 ? 1 : 0;
      full_chunks += in.num_tokens() == cfg.max_tokens ? 1 : 0;
    }
    const int program = k % 5 == 0 ? 1 : 0;
    INFO("k = " << k << " chunks, program " << program);
    const State want = run_from(ex, splitter, start, s, rows, program, How::chunks);
    // The reference did run: the last token's row is no longer poison, the row after the step is.
    const int step_tokens = static_cast<int>(graphs::ChunkInput{s.requests}.num_tokens());
    const auto last = static_cast<std::size_t>(ex.program_layers(program).back());
    const std::size_t h = static_cast<std::size_t>(cfg.layers[last].h_q);
    CHECK(!std::isnan(want.outputs[last].lse[static_cast<std::size_t>(step_tokens - 1) * h]));
    if (step_tokens < kStepTokens) CHECK(std::isnan(want.outputs[last].lse[static_cast<std::size_t>(step_tokens) * h]));
    CHECK(run_from(ex, splitter, start, s, rows, program, How::step_eager) == want);
    CHECK(run_from(ex, splitter, start, s, rows, program, How::step_graph) == want);
    CHECK(run_from(ex, splitter, start, s, rows, program, How::step_graph) == want);  // replayed again
  }
  CHECK(buckets_seen.size() >= 5);
  CHECK(one_request_chunks > 0);
  CHECK(full_chunks > 0);
  CHECK(graphs::GraphExec::instantiations() == after_warmup);  // no graph made after warm-up
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("a step of one chunk launches as a chunk: its bucket's step body behind the chunk staging block, not the step loop", "[gpu][step]") {
  const model::PipelineConfig cfg = step_program();
  graphs::Executor ex(cfg, step_options());
  ex.warmup();
  World world(ex, 29);
  graphs::StepSplitter splitter(cfg, ex.step_layout());
  std::mt19937_64& rng = world.rng();
  upload_step_rows(ex, random_rows(ex, rng));
  for (const bool graph : {true, false}) {
    INFO((graph ? "graph" : "eager"));
    for (const int k : {1, 3, 1}) {
      INFO("k = " << k);
      const StepData s = step_of(cfg, splitter, k, rng);
      const graphs::StepSplit split = splitter.split(s.input());
      REQUIRE(split.chunks == k);
      const graphs::ChunkInput first = splitter.chunk(0);
      const int bucket = ex.buckets().lookup(static_cast<int>(first.requests.size()), static_cast<int>(first.num_tokens()));
      const graphs::RunResult r = graph ? ex.run(s.input()) : ex.run_eager(s.input());
      require_ok(r);
      CHECK(r.chunks == k);
      // The bucket is reported for a launch of one chunk; a step of several runs the step loop.
      CHECK(r.bucket == (k == 1 ? bucket : -1));
    }
  }
  ex.synchronize();
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("a chunk metadata block larger than one CTA's copy: next stages every chunk whole", "[gpu][step]") {
  // max_model_len 65536 widens the block tables: a chunk's block is thousands of 16-byte vectors,
  // which next copies with several CTAs, the last of which advances the chunk index.
  model::PipelineConfig cfg = step_program();
  cfg.max_model_len = 65536;
  graphs::Executor ex(cfg, step_options());
  ex.warmup();
  REQUIRE(ex.step_layout().chunk_words / 4 > 4 * 256);  // more than four CTAs of 256 threads
  StepStart at(ex, 23);
  World& world = at.world;
  const Caches& start = at.caches;
  graphs::StepSplitter& splitter = at.splitter;
  const StepRows& rows = at.rows;
  for (const int k : {3, 16, 9}) {
    INFO("k = " << k << " chunks");
    const StepData s = step_of(cfg, splitter, k, world.rng());
    const State want = run_from(ex, splitter, start, s, rows, 0, How::chunks);
    CHECK(run_from(ex, splitter, start, s, rows, 0, How::step_graph) == want);
    CHECK(run_from(ex, splitter, start, s, rows, 0, How::step_eager) == want);
  }
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("the step graph holds head, two WHILEs, tail; next_fast and the largest body; next, SWITCH and one body of "
          "layers per bucket", "[gpu][step]") {
  graphs::Executor ex(step_program(), step_options());
  ex.warmup();
  for (int p = 0; p < ex.programs(); ++p) {
    std::vector<const graphs::Pipeline*> bodies;
    std::size_t want = 7;
    for (int b = 0; b < ex.buckets().size(); ++b) {
      const graphs::Pipeline& body = ex.step_body(p, b);
      CHECK(body.step_rows());
      CHECK(!ex.pipeline(p, b).step_rows());
      CHECK(body.kernel_launches() == ex.pipeline(p, b).kernel_launches());
      bodies.push_back(&body);
      want += static_cast<std::size_t>(body.kernel_launches() - 1);  // a body: the layers, no stage-in
    }
    const int largest = bodies.back()->kernel_launches() - 1;
    want += static_cast<std::size_t>(largest);  // the first loop's copy of the largest body
    for (int s = -1; s < 2; ++s) {  // -1: a staged step's reruns, with no staging block
      const graphs::StepGraph g = ex.record_step_graph(p, s);
      CHECK(g.graph.node_count() == 4);
      std::size_t fast_nodes = 0;
      REQUIRE(cudaGraphGetNodes(g.fast_loop_body, nullptr, &fast_nodes) == cudaSuccess);
      CHECK(fast_nodes == static_cast<std::size_t>(1 + largest));
      std::size_t loop_nodes = 0;
      REQUIRE(cudaGraphGetNodes(g.loop_body, nullptr, &loop_nodes) == cudaSuccess);
      CHECK(loop_nodes == 2);
      REQUIRE(g.bucket_bodies.size() == static_cast<std::size_t>(ex.buckets().size()));
      for (int b = 0; b < ex.buckets().size(); ++b) {
        std::size_t n = 0;
        REQUIRE(cudaGraphGetNodes(g.bucket_bodies[static_cast<std::size_t>(b)], nullptr, &n) == cudaSuccess);
        CHECK(n == static_cast<std::size_t>(ex.pipeline(p, b).kernel_launches() - 1));
      }
      CHECK(g.node_count() == want);
      CHECK(graphs::StepGraph::expected_nodes(bodies) == want);
    }
  }
}

TEST_CASE("an all-full step within flat_step_chunks launches one plain graph of the largest body, bit for bit as its "
          "chunks one by one", "[gpu][step]") {
  const model::PipelineConfig cfg = step_program();
  constexpr int kFlat = 12;
  graphs::Executor ex(cfg, step_options(true, kFlat));
  const graphs::WarmupReport report = ex.warmup();
  CHECK(report.flat_step_graphs == 2 * ex.programs() * (kFlat - 1));
  CHECK(report.staged_one_chunk_graphs == 3 * ex.programs() * ex.buckets().size());
  // The flat graph holds head, tail and per chunk next and the largest body's layers, no
  // conditional node.
  for (int p = 0; p < ex.programs(); ++p) {
    const graphs::Pipeline& largest = ex.step_body(p, ex.buckets().size() - 1);
    for (const int k : {2, 7, kFlat}) {
      const graphs::Graph g = ex.record_flat_step_graph(p, k, k % 3 - 1);  // staging 1, 0 and -1 (reruns)
      std::size_t n = 0;
      REQUIRE(cudaGraphGetNodes(g.get(), nullptr, &n) == cudaSuccess);
      std::vector<cudaGraphNode_t> nodes(n);
      REQUIRE(cudaGraphGetNodes(g.get(), nodes.data(), &n) == cudaSuccess);
      CHECK(n == graphs::flat_step_nodes(largest, k));
      CHECK(n == static_cast<std::size_t>(2 + k * largest.kernel_launches()));
      int kernels = 0;
      for (cudaGraphNode_t node : nodes) {
        cudaGraphNodeType type{};
        REQUIRE(cudaGraphNodeGetType(node, &type) == cudaSuccess);
        kernels += type == cudaGraphNodeTypeKernel ? 1 : 0;
      }
      CHECK(kernels == static_cast<int>(n));
    }
  }
  StepStart at(ex, 23);
  auto& [world, start, splitter, rows] = at;
  std::mt19937_64& rng = world.rng();
  // All-full steps of 2 .. 16 chunks (those over kFlat on the step graph), and steps that are not
  // all full (on the step graph), in a shuffled order.
  std::vector<int> ks(15);
  std::iota(ks.begin(), ks.end(), 2);
  std::shuffle(ks.begin(), ks.end(), rng);
  for (const int k : ks) {
    for (const bool full : {true, false}) {
      const StepData s = full ? full_step_of(cfg, splitter, k, rng) : step_of(cfg, splitter, k, rng);
      const bool all_full = is_all_full(ex, splitter, s);
      if (!full && all_full) continue;  // the random step came out full: its case is the other one
      const int program = k % 3 == 0 ? 1 : 0;
      INFO("k = " << k << " chunks, " << (full ? "all full" : "not all full") << ", program " << program);
      const State want = run_from(ex, splitter, start, s, rows, program, How::chunks);
      const std::uint64_t flat_before = ex.flat_steps();
      CHECK(run_from(ex, splitter, start, s, rows, program, How::step_graph) == want);
      CHECK(ex.flat_steps() == flat_before + (full && k <= kFlat ? 1 : 0));
      CHECK(run_from(ex, splitter, start, s, rows, program, How::step_eager) == want);
      CHECK(ex.flat_steps() == flat_before + (full && k <= kFlat ? 1 : 0));  // eager: never the flat graph
    }
  }
  CHECK(ex.flat_steps() == static_cast<std::uint64_t>(kFlat - 1));
  // Steps of no chunk and of one chunk (launched as a chunk) never take a flat graph.
  require_ok(ex.run(graphs::StepInput{}, 0));
  require_ok(ex.run(full_step_of(cfg, splitter, 1, rng).input(), 0));
  CHECK(ex.flat_steps() == static_cast<std::uint64_t>(kFlat - 1));
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("with flat_step_pad every step within flat_step_chunks launches its flat graph, bit for bit as its chunks "
          "one by one at the largest bucket", "[gpu][step]") {
  // The padded flat graph runs every chunk on the largest bucket's body: its reference is the
  // same chunks run one by one by an executor whose only bucket is the largest (a chunk's own
  // smaller bucket may take another attention path, the top-k split, whose sums round
  // differently). Both executors start from the same seed: the same caches and step rows.
  const model::PipelineConfig cfg = step_program();
  constexpr int kFlat = 8;
  graphs::ExecutorOptions opt = step_options(true, kFlat);
  opt.flat_step_pad = true;
  graphs::Executor ex(cfg, opt);
  const graphs::WarmupReport report = ex.warmup();
  CHECK(report.flat_step_graphs == 2 * ex.programs() * (kFlat - 1));
  graphs::ExecutorOptions largest_only = step_options();
  largest_only.r_buckets = {cfg.max_requests};
  largest_only.t_buckets = {cfg.max_tokens};
  graphs::Executor ref(cfg, largest_only);
  ref.warmup();
  REQUIRE(ref.buckets().size() == 1);
  REQUIRE(ex.buckets().size() > 1);
  StepStart at(ex, 41);
  StepStart ref_at(ref, 41);
  REQUIRE(ref_at.caches == at.caches);
  REQUIRE(ref_at.rows.q == at.rows.q);
  REQUIRE(ref_at.rows.topk == at.rows.topk);
  REQUIRE(ref_at.rows.k_rows == at.rows.k_rows);
  REQUIRE(ref_at.rows.compressed_k_rows == at.rows.compressed_k_rows);
  std::mt19937_64& rng = at.world.rng();
  int not_full = 0;
  for (const int k : {3, 1, 8, 5, 2, 9, 12}) {
    const StepData s = step_of(cfg, at.splitter, k, rng);
    const bool all_full = is_all_full(ex, at.splitter, s);
    not_full += all_full ? 0 : 1;
    const int program = k % 2;
    INFO("k = " << k << " chunks" << (all_full ? ", all full" : "") << ", program " << program);
    // Over kFlat chunks the step graph runs the step, and a staged step of one chunk its bucket's
    // plain graph: each chunk at its own bucket.
    const State want = k > 1 && k <= kFlat ? run_from(ref, ref_at.splitter, ref_at.caches, s, ref_at.rows, program, How::chunks)
                                  : run_from(ex, at.splitter, at.caches, s, at.rows, program, How::chunks);
    const std::uint64_t flat_before = ex.flat_steps();
    if (k > 1) {  // run(StepInput) launches a step of one chunk as a chunk, at its own bucket
      CHECK(run_from(ex, at.splitter, at.caches, s, at.rows, program, How::step_graph) == want);
      CHECK(ex.flat_steps() == flat_before + (k <= kFlat ? 1 : 0));
    }
    // Staged: the first run from the staging block, then again from the device state.
    write_caches(ex, at.caches);
    poison_outputs(ex);
    require_ok(ex.stage(s.input()));
    require_ok(ex.run_staged(program));
    CHECK(read_state(ex) == want);
    write_caches(ex, at.caches);
    poison_outputs(ex);
    require_ok(ex.run_staged(program));
    CHECK(read_state(ex) == want);
    CHECK(ex.flat_steps() == flat_before + (k <= kFlat ? (k > 1 ? 3 : 2) : 0));
  }
  CHECK(not_full >= 3);  // the case is about steps that are not all full
  CHECK(ex.read_run_faults().total() == 0);
  CHECK(ref.read_run_faults().total() == 0);
}

TEST_CASE("a staged step runs for each program as run(StepInput) does, bit for bit: its first run from the staging "
          "block, every later run from the device state alone", "[gpu][step]") {
  const model::PipelineConfig cfg = step_program();
  constexpr int kFlat = 6;
  graphs::Executor ex(cfg, step_options(true, kFlat));
  const graphs::WarmupReport report = ex.warmup();
  CHECK(report.staged_step_graphs == ex.programs() * kFlat);  // the step graph and kFlat - 1 flat ones each
  StepStart at(ex, 31);
  auto& [world, start, splitter, rows] = at;
  std::mt19937_64& rng = world.rng();
  const auto reset = [&] {
    write_caches(ex, at.caches);  // (a lambda names the member: some compilers capture no structured binding)
    poison_outputs(ex);
  };
  // Where a rerun read the chunks' blocks from a staging block, it would read these: zero lengths,
  // so no chunk would write a row. The header stays: the host reads it (the count, the buckets).
  const auto poison_staging = [&] {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::size_t header = static_cast<std::size_t>(ex.step_layout().header_words) * 4;
    for (const char* slot : graphs::slots::kStepStaging) {
      std::memset(ex.pool().bytes(slot, ex.step_layout().bytes()) + header, 0, ex.step_layout().bytes() - header);
    }
  };
  // Steps of 1 .. 16 chunks, all full (flat within kFlat) or not, in a shuffled order.
  std::vector<int> ks(16);
  std::iota(ks.begin(), ks.end(), 1);
  std::shuffle(ks.begin(), ks.end(), rng);
  std::uint64_t reruns = 0;
  for (const int k : ks) {
    const bool full = k % 2 == 0;
    const StepData s = full ? full_step_of(cfg, splitter, k, rng) : step_of(cfg, splitter, k, rng);
    const bool all_full = is_all_full(ex, splitter, s);  // a random step may come out all full
    CHECK((!full || all_full));
    INFO("k = " << k << " chunks" << (all_full ? ", all full" : ""));
    // The references: run(StepInput) of each program (equal to its chunks one by one: the cases above).
    State want[2];
    const int step_tokens = static_cast<int>(graphs::ChunkInput{s.requests}.num_tokens());
    for (int p = 0; p < 2; ++p) {
      want[p] = run_from(ex, splitter, start, s, rows, p, How::step_graph);
      // The reference did run: its last layer's row of the step's last token is no longer poison.
      const auto last = static_cast<std::size_t>(ex.program_layers(p).back());
      const std::size_t h = static_cast<std::size_t>(cfg.layers[last].h_q);
      REQUIRE(!std::isnan(want[p].outputs[last].lse[static_cast<std::size_t>(step_tokens - 1) * h]));
    }
    const std::uint64_t flat_before = ex.flat_steps();
    const graphs::RunResult staged = ex.stage(s.input());
    require_ok(staged);
    CHECK(staged.chunks == k);
    CHECK(ex.staged_chunks() == k);
    // First run (program k % 2), then every program again with the staging blocks poisoned.
    const int first = k % 2;
    reset();
    require_ok(ex.run_staged(first));
    CHECK(read_state(ex) == want[first]);
    poison_staging();
    for (const int p : {1 - first, first, 1 - first}) {
      reset();
      require_ok(ex.run_staged(p));
      CHECK(read_state(ex) == want[p]);
      ++reruns;
    }
    reset();
    require_ok(ex.run_staged_eager(first));
    CHECK(read_state(ex) == want[first]);
    ++reruns;
    // A chunk run in between uses its own staging block and the metadata block, not the step's.
    reset();
    const StepData one = step_of(cfg, splitter, 1, rng);
    REQUIRE(splitter.split(one.input()).chunks == 1);
    require_ok(ex.run(splitter.chunk(0), 0));
    reset();
    require_ok(ex.run_staged(1 - first));
    CHECK(read_state(ex) == want[1 - first]);
    ++reruns;
    CHECK(ex.staged_reruns() == reruns);
    // An all-full step within kFlat ran its flat graphs, and a step of one chunk its bucket's
    // plain graph: five graph runs (the eager one not).
    CHECK(ex.flat_steps() == flat_before + ((all_full && k <= kFlat) || k == 1 ? 5 : 0));
  }
  CHECK(ex.read_run_faults().total() == 0);
}

TEST_CASE("a step of no chunks launches and writes nothing", "[gpu][step]") {
  for (const bool graph : {true, false}) {
    INFO((graph ? "graph" : "eager"));
    graphs::Executor ex(step_program(), step_options());
    ex.warmup();
    World world(ex, 3);
    const Caches start = read_caches(ex);
    poison_outputs(ex);
    const std::uint64_t steps = ex.steps();
    const graphs::RunResult r = graph ? ex.run(graphs::StepInput{}) : ex.run_eager(graphs::StepInput{});
    require_ok(r);
    CHECK(r.chunks == 0);
    CHECK(ex.steps() == steps + 1);  // it was launched
    const State after = read_state(ex);
    CHECK(after.caches == start);
    for (const LayerOutputs& o : after.outputs) {
      CHECK(std::all_of(o.out.begin(), o.out.end(), [](std::uint16_t v) { return v == 0xFFFF; }));
      CHECK(std::all_of(o.lse.begin(), o.lse.end(), [](float v) { return std::isnan(v); }));
      CHECK(std::all_of(o.max_logits.begin(), o.max_logits.end(), [](float v) { return std::isnan(v); }));
    }
  }
}

TEST_CASE("refused steps write nothing and name the chunk and the request at fault", "[gpu][step]") {
  const model::PipelineConfig cfg = step_program();
  graphs::Executor ex(cfg, step_options());
  ex.warmup();
  StepStart at(ex, 5);
  World& world = at.world;
  const Caches& start = at.caches;
  graphs::StepSplitter& splitter = at.splitter;
  const StepRows& rows = at.rows;
  const StepData good = step_of(cfg, splitter, 6, world.rng());
  const State want = run_from(ex, splitter, start, good, rows, 0, How::chunks);

  StepData bad = step_of(cfg, splitter, 6, world.rng());
  const std::size_t victim = bad.requests.size() - 1;
  bad.swa[victim].back() = cfg.cache.swa_blocks;  // a block id past the cache
  bad.requests[victim].swa_blocks = bad.swa[victim];
  // The first chunk that stages the bad block: the first piece of the victim whose window reaches it.
  const graphs::StepSplit split = splitter.split(bad.input());
  const int bad_block_start = cfg.cache.swa_block_size * static_cast<int>(bad.swa[victim].size() - 1);
  int want_chunk = -1;
  for (int c = 0; c < split.chunks && want_chunk < 0; ++c) {
    const graphs::ChunkInput in = splitter.chunk(c);
    for (std::size_t b = 0; b < in.requests.size(); ++b) {
      if (splitter.request_of(c, static_cast<int>(b)) == static_cast<int>(victim) && in.requests[b].seq_len > bad_block_start) {
        want_chunk = c;
      }
    }
  }
  graphs::RunResult r = ex.run(bad.input());
  CHECK(r.status == graphs::RunStatus::bad_chunk);
  CHECK(r.bad_chunk == want_chunk);
  CHECK(r.bad_request == static_cast<int>(victim));
  std::vector<graphs::RequestInput> many(kStepRequests + 1, good.requests[0]);
  r = ex.run(graphs::StepInput{many});
  CHECK(r.status == graphs::RunStatus::no_bucket);
  CHECK(std::string(r.bad_field) == "step.requests");
  // More tokens than max_step_tokens, the rows the buffers hold: refused naming step.tokens.
  std::vector<graphs::RequestInput> long_step(1, good.requests[0]);
  long_step[0].query_len = kStepTokens + 1;
  long_step[0].seq_len = kStepTokens + 1;
  r = ex.run(graphs::StepInput{long_step});
  CHECK(r.status == graphs::RunStatus::no_bucket);
  CHECK(std::string(r.bad_field) == "step.tokens");
  // Nothing was staged by the refusals: the next step is exactly the good one.
  CHECK(run_from(ex, splitter, start, good, rows, 0, How::step_graph) == want);

  graphs::Executor no_steps(cfg, graphs::ExecutorOptions{});
  no_steps.warmup();
  CHECK(no_steps.run(good.input()).status == graphs::RunStatus::not_warmed_up);
  graphs::Executor eager_only(cfg, step_options(false));
  eager_only.warmup();
  CHECK(eager_only.run(good.input()).status == graphs::RunStatus::not_warmed_up);
  World eager_world(eager_only, 5);
  eager_world.randomize_topk_all(kMinPrefix);
  require_ok(eager_only.run_eager(good.input()));
}

TEST_CASE("steady-state steps of varying size make zero CUDA allocation calls over 1000 steps", "[gpu][step]") {
  auto& counter = memory::AllocationCounter::instance();
  const model::PipelineConfig cfg = step_program();
  graphs::Executor ex(cfg, step_options());
  ex.warmup();
  World world(ex, 9);
  world.randomize_topk_all(kMinPrefix);
  graphs::StepSplitter splitter(cfg, ex.step_layout());
  std::vector<StepData> steps;
  for (int k = 0; k <= 16; ++k) steps.push_back(step_of(cfg, splitter, k, world.rng()));
  counter.reset();
  { core::DeviceBuffer probe(4096); }
  CHECK(counter.count() >= 2);  // the counter sees allocations
  counter.reset();
  constexpr int kSteps = 1000;
  for (int i = 0; i < kSteps; ++i) {
    const graphs::RunResult r = ex.run(steps[static_cast<std::size_t>((i * 7) % 17)].input(), i % 3 == 0 ? 1 : 0);
    if (!r.ok()) require_ok(r);
  }
  ex.synchronize();
  const auto names = counter.names();
  INFO("allocation calls seen: " << (names.empty() ? std::string("none") : names.front()));
  CHECK(counter.count() == 0);
  CHECK(ex.read_run_faults().total() == 0);
}
