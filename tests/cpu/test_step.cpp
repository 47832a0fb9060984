// Steps on the host: the split rule shared by the scheduler and run(StepInput), the step options'
// validation, the step staging layout and its pool slots (src/spgraph/graphs/step.hpp, docs/graphs.md "Steps").
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/small_configs.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/chunk_format.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/layer_buffers.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"
#include "spgraph/graphs/step.hpp"
#include "spgraph/kernels/step_loop/step_loop.hpp"
#include "spgraph/scheduler/prefill_scheduler.hpp"

using namespace spg;

namespace {

bool contains(const std::string& text, const std::string& part) {
  UNSCOPED_INFO(text);
  return text.find(part) != std::string::npos;
}

std::string refusal(const model::PipelineConfig& c, const graphs::ExecutorOptions& o) {
  try {
    graphs::Executor::check_options(c, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

graphs::ExecutorOptions step_options(int requests, int tokens) {
  graphs::ExecutorOptions o;
  o.max_step_requests = requests;
  o.max_step_tokens = tokens;
  return o;
}

/// A step of `n` requests with random query lengths in [1, max_query] (seq_len = prefix + query).
std::vector<graphs::RequestInput> random_step(std::mt19937& rng, int n, int max_query) {
  std::vector<graphs::RequestInput> r(static_cast<std::size_t>(n));
  for (auto& q : r) {
    q.query_len = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_query));
    q.seq_len = q.query_len + static_cast<int>(rng() % 300);
  }
  return r;
}

}  // namespace

TEST_CASE("the split keeps every chunk within R and T, each request's pieces contiguous and in order", "[cpu][step]") {
  const model::PipelineConfig c = test::two_layer_config();  // R = 4, T = 64
  const graphs::StepLayout layout = graphs::StepLayout::make(c, 64, 4096);
  graphs::StepSplitter splitter(c, layout);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 64);
    const int max_query = trial % 3 == 0 ? 200 : (trial % 3 == 1 ? 64 : 9);
    std::vector<graphs::RequestInput> reqs = random_step(rng, n, max_query);
    int tokens = 0;
    for (const auto& r : reqs) tokens += r.query_len;
    if (tokens > layout.max_tokens) continue;
    const graphs::StepSplit s = splitter.split(graphs::StepInput{reqs});
    REQUIRE(s.status == graphs::RunStatus::ok);
    REQUIRE(s.chunks >= 1);
    REQUIRE(s.chunks <= graphs::max_split_chunks(n, tokens, c.max_tokens));
    // Walk the chunks: the pieces of request i follow each other, sum to its query_len and end
    // at its seq_len; a request appears at most once per chunk and only the first piece of a
    // chunk may continue the request before it.
    int request = 0;
    int placed = 0;
    int total = 0;
    for (int k = 0; k < s.chunks; ++k) {
      const graphs::ChunkInput in = splitter.chunk(k);
      REQUIRE(!in.requests.empty());
      REQUIRE(in.requests.size() <= static_cast<std::size_t>(c.max_requests));
      REQUIRE(in.num_tokens() <= c.max_tokens);
      for (std::size_t b = 0; b < in.requests.size(); ++b) {
        if (placed == reqs[static_cast<std::size_t>(request)].query_len) {
          ++request;
          placed = 0;
        }
        REQUIRE(splitter.request_of(k, static_cast<int>(b)) == request);
        const graphs::RequestInput& whole = reqs[static_cast<std::size_t>(request)];
        REQUIRE((placed == 0 || b == 0));  // a continuation opens its chunk
        placed += in.requests[b].query_len;
        REQUIRE(in.requests[b].query_len >= 1);
        REQUIRE(in.requests[b].seq_len == whole.seq_len - whole.query_len + placed);
        total += in.requests[b].query_len;
      }
      // A chunk closes early only when it is full: the next piece opens a fresh chunk because
      // this one holds R requests or T tokens, or continues a request (which may not join twice).
    }
    CHECK(request == n - 1);
    CHECK(total == tokens);
  }
}

TEST_CASE("run(StepInput) cuts a scheduler's step back into the scheduler's own chunks", "[cpu][step]") {
  model::PipelineConfig c = test::two_layer_config();
  c.cache.swa_blocks = 4000;
  c.cache.compressed_blocks = 1000;
  for (const int budget : {64, 100, 300, 1024}) {
    scheduler::SchedulerConfig sc;
    sc.max_num_batched_tokens = budget;
    scheduler::PrefillScheduler sched(c, sc);
    std::mt19937 rng(static_cast<unsigned>(budget));
    for (int i = 0; i < 40; ++i) {
      scheduler::Request r;
      r.id = i;
      r.prompt_len = 1 + static_cast<int>(rng() % (i % 4 == 0 ? 700U : 40U));
      sched.submit(r);
    }
    const graphs::StepLayout layout = graphs::StepLayout::make(c, 64, budget);
    graphs::StepSplitter splitter(c, layout);
    int steps = 0;
    while (!sched.done() && steps < 200) {
      const scheduler::StepPlan plan = sched.schedule();
      ++steps;
      const graphs::StepInput& in = plan.input();
      const graphs::StepSplit s = splitter.split(in);
      REQUIRE(s.status == graphs::RunStatus::ok);
      REQUIRE(s.chunks == static_cast<int>(plan.chunks.size()));
      for (int k = 0; k < s.chunks; ++k) {
        const scheduler::ChunkPlan& want = plan.chunks[static_cast<std::size_t>(k)];
        const graphs::ChunkInput got = splitter.chunk(k);
        REQUIRE(got.requests.size() == static_cast<std::size_t>(want.num_requests));
        for (std::size_t b = 0; b < got.requests.size(); ++b) {
          CHECK(got.requests[b].query_len == want.query_lens[b]);
          CHECK(got.requests[b].seq_len == want.seq_lens[b]);
          CHECK(got.requests[b].swa_blocks.size() >= want.caches[0].block_tables[b].size());
        }
      }
    }
    CHECK(sched.done());
  }
}

TEST_CASE("a step over its maxima or with a bad request is refused, naming what is wrong", "[cpu][step]") {
  const model::PipelineConfig c = test::two_layer_config();
  const graphs::StepLayout layout = graphs::StepLayout::make(c, 8, 100);
  graphs::StepSplitter splitter(c, layout);
  std::vector<graphs::RequestInput> reqs(9);
  for (auto& r : reqs) r.query_len = r.seq_len = 1;
  graphs::StepSplit s = splitter.split(graphs::StepInput{reqs});
  CHECK(s.status == graphs::RunStatus::no_bucket);
  CHECK(std::string(s.bad_field) == "step.requests");
  reqs.resize(8);
  reqs[3].query_len = reqs[3].seq_len = 94;  // 101 tokens
  s = splitter.split(graphs::StepInput{reqs});
  CHECK(s.status == graphs::RunStatus::no_bucket);
  CHECK(std::string(s.bad_field) == "step.tokens");
  reqs[3].query_len = reqs[3].seq_len = 93;  // 100 tokens: at the maximum
  s = splitter.split(graphs::StepInput{reqs});
  CHECK(s.status == graphs::RunStatus::ok);
  CHECK(s.chunks == 3);  // [r0 r1 r2 r3: 1+1+1+61], [r3: 32, r4 r5 r6], [r7]
  reqs[5].query_len = 0;
  s = splitter.split(graphs::StepInput{reqs});
  CHECK(s.status == graphs::RunStatus::bad_chunk);
  CHECK(s.bad_request == 5);
  CHECK(std::string(s.bad_field) == "query_len");
  reqs[5].query_len = 2;
  reqs[5].seq_len = 1;
  s = splitter.split(graphs::StepInput{reqs});
  CHECK(s.status == graphs::RunStatus::bad_chunk);
  CHECK(s.bad_request == 5);
  CHECK(std::string(s.bad_field) == "seq_len");
  s = splitter.split(graphs::StepInput{});
  CHECK(s.status == graphs::RunStatus::ok);
  CHECK(s.chunks == 0);
}

TEST_CASE("the chunk bound holds for the steps that reach it", "[cpu][step]") {
  // Requests of T + 1 tokens: each opens a chunk, fills it and continues into a fresh one.
  const model::PipelineConfig c = test::two_layer_config();  // T = 64
  const int n = 10;
  const int tokens = n * 65;
  const graphs::StepLayout layout = graphs::StepLayout::make(c, n, tokens);
  graphs::StepSplitter splitter(c, layout);
  std::vector<graphs::RequestInput> reqs(n);
  for (auto& r : reqs) r.query_len = r.seq_len = 65;
  const graphs::StepSplit s = splitter.split(graphs::StepInput{reqs});
  REQUIRE(s.status == graphs::RunStatus::ok);
  CHECK(s.chunks == 11);  // [r0 64], [r0 1, r1 63], [r1 2, r2 62], ... [r9 10]
  CHECK(s.chunks <= layout.max_chunks);
  CHECK(layout.max_chunks == graphs::max_split_chunks(n, tokens, 64));
  CHECK(graphs::max_split_chunks(64, 16384, 2048) == 72);
  CHECK(graphs::max_split_chunks(64, 10, 2048) == 10);  // every chunk holds a token
}

TEST_CASE("step options are validated, naming the field and its bounds", "[cpu][step]") {
  const model::PipelineConfig c = test::two_layer_config();
  CHECK(refusal(c, step_options(0, 0)) == "accepted");
  CHECK(refusal(c, step_options(64, 16384)) == "accepted");
  CHECK(contains(refusal(c, step_options(0, 16)), "max_step_requests = 0"));
  CHECK(contains(refusal(c, step_options(64, 0)), "max_step_tokens = 0"));
  CHECK(contains(refusal(c, step_options(-1, 16)), "[1, 4096]"));
  CHECK(contains(refusal(c, step_options(5000, 16)), "max_step_requests = 5000"));
  CHECK(contains(refusal(c, step_options(4, (1 << 20) + 1)), "max_step_tokens = 1048577"));
  // Flat step graphs: only with steps, and 0 or [2, max_chunks].
  graphs::ExecutorOptions flat = step_options(64, 1024);
  const int max_chunks = graphs::max_split_chunks(64, 1024, c.max_tokens);
  for (const int k : {0, 2, max_chunks}) {
    flat.flat_step_chunks = k;
    CHECK(refusal(c, flat) == "accepted");
  }
  for (const int k : {1, -3, max_chunks + 1}) {
    flat.flat_step_chunks = k;
    const std::string why = refusal(c, flat);
    CHECK(contains(why, "flat_step_chunks = " + std::to_string(k)));
    CHECK(contains(why, "[2, " + std::to_string(max_chunks) + "]"));
  }
  graphs::ExecutorOptions no_steps;
  no_steps.flat_step_chunks = 4;
  CHECK(contains(refusal(c, no_steps), "flat_step_chunks = 4 needs steps"));
  // Padded flat steps: only with flat step graphs.
  flat.flat_step_chunks = 0;
  flat.flat_step_pad = true;
  CHECK(contains(refusal(c, flat), "flat_step_pad = true needs flat step graphs: set flat_step_chunks"));
  flat.flat_step_chunks = 2;
  CHECK(refusal(c, flat) == "accepted");
}

TEST_CASE("the step staging block: header, then 16-byte aligned chunk blocks, planned as pool slots", "[cpu][step]") {
  const model::PipelineConfig c = test::two_layer_config();
  const graphs::ExecutorPlan plan = graphs::plan_executor(c, step_options(64, 1000));
  const graphs::StepLayout& l = plan.step;
  CHECK(l.max_chunks == graphs::max_split_chunks(64, 1000, c.max_tokens));
  CHECK(l.header_words == kernels::StepStateWords::header_words(l.max_chunks));
  CHECK(l.header_words >= kernels::StepStateWords::buckets + l.max_chunks);
  CHECK(l.header_words % 4 == 0);
  CHECK(l.chunk_words == graphs::ChunkMetaLayout::make(c).words);
  CHECK(l.chunk_words % 4 == 0);
  CHECK(l.chunk_offset(0) == static_cast<std::size_t>(l.header_words));
  CHECK(l.chunk_offset(3) == static_cast<std::size_t>(l.header_words) + 3U * static_cast<std::size_t>(l.chunk_words));
  CHECK(l.bytes() == 4 * l.chunk_offset(l.max_chunks));
  for (const char* name : graphs::slots::kStepStaging) {
    const memory::Slot* slot = plan.pool.find(name);
    REQUIRE(slot != nullptr);
    CHECK(slot->spec.bytes == l.bytes());
    CHECK(slot->spec.kind == memory::MemoryKind::pinned_host);
    CHECK(slot->offset % 16 == 0);
  }
  const memory::Slot* state = plan.pool.find(graphs::slots::kStepState);
  REQUIRE(state != nullptr);
  CHECK(state->spec.bytes == static_cast<std::size_t>(l.header_words) * 4);
  CHECK(state->spec.kind == memory::MemoryKind::device);
  const memory::Slot* meta = plan.pool.find(graphs::slots::kStepMeta);
  REQUIRE(meta != nullptr);
  CHECK(meta->spec.bytes == static_cast<std::size_t>(l.max_chunks) * static_cast<std::size_t>(l.chunk_words) * 4);
  CHECK(meta->spec.bytes == l.meta_bytes());
  CHECK(meta->spec.kind == memory::MemoryKind::device);
  // Without steps nothing is planned for them.
  const graphs::ExecutorPlan none = graphs::plan_executor(c, {});
  CHECK(none.step.max_chunks == 0);
  CHECK(none.pool.find(graphs::slots::kStepState) == nullptr);
  CHECK(none.pool.find(graphs::slots::kStepStaging[0]) == nullptr);
  CHECK(none.pool.find(graphs::slots::kStepMeta) == nullptr);
}

TEST_CASE("with steps the row-indexed layer buffers hold a whole step", "[cpu][step]") {
  const model::PipelineConfig c = test::two_layer_config();
  const graphs::StepBounds step{64, 1000};
  const graphs::ExecutorPlan with = graphs::plan_executor(c, step_options(step.requests, step.tokens));
  const graphs::ExecutorPlan without = graphs::plan_executor(c, {});
  for (std::size_t l = 0; l < c.layers.size(); ++l) {
    const model::LayerConfig& layer = c.layers[l];
    for (const graphs::LayerBuffer b : graphs::kLayerBuffers) {
      if (b == graphs::LayerBuffer::swa_cache || b == graphs::LayerBuffer::compressed_cache ||
          b == graphs::LayerBuffer::attn_sink || !graphs::layer_uses(layer, b, true)) {
        continue;
      }
      INFO("layer " << l << " " << graphs::layer_buffer_name(b));
      const std::size_t alone = graphs::required_rows(c, layer, b);
      const std::size_t rows = graphs::required_rows(c, layer, b, step);
      if (b == graphs::LayerBuffer::compressed_k_rows) {
        const int r = layer.compress_ratio;
        CHECK(alone == static_cast<std::size_t>(c.max_tokens / r + c.max_requests));
        CHECK(rows == static_cast<std::size_t>(std::max(c.max_tokens / r + c.max_requests, step.tokens / r + step.requests)));
      } else {
        CHECK(alone == static_cast<std::size_t>(c.max_tokens));
        CHECK(rows == static_cast<std::size_t>(std::max(c.max_tokens, step.tokens)));
      }
      // The pool's slot grows by exactly the rows (the slot's bytes are rows x the row's bytes).
      const memory::Slot* a = without.pool.find(graphs::slots::layer_slot(l, b));
      const memory::Slot* w = with.pool.find(graphs::slots::layer_slot(l, b));
      REQUIRE(a != nullptr);
      REQUIRE(w != nullptr);
      CHECK(w->spec.bytes * alone == a->spec.bytes * rows);
    }
  }
  // A binding with a chunk's rows only is refused with steps, naming the buffer and the rows.
  std::vector<graphs::LayerBuffers> bound(c.layers.size());
  auto* base = reinterpret_cast<__nv_bfloat16*>(std::uintptr_t{1} << 20);  // never dereferenced: host checks
  const auto h = static_cast<std::size_t>(c.layers[0].h_q);
  const auto d = static_cast<std::size_t>(c.layers[0].d_qk);
  bound[0].q = graphs::contiguous_view<__nv_bfloat16, 3>(base, {static_cast<std::size_t>(c.max_tokens), h, d});
  graphs::check_binding_shapes(c, bound, {}, true);  // enough for chunks alone
  try {
    graphs::check_binding_shapes(c, bound, {}, true, step);
    FAIL("a chunk-sized q was accepted for steps of 1000 tokens");
  } catch (const InvalidArgument& e) {
    CHECK(contains(e.what(), "q"));
    CHECK(contains(e.what(), "needs at least 1000"));
  }
}

TEST_CASE("a step's chunks are staged with their rows: token and compressed-row offsets in chunk order",
          "[cpu][step]") {
  model::PipelineConfig c = test::two_layer_config();
  graphs::ChunkEncoder encoder(c, true);
  graphs::StepLayout layout = graphs::StepLayout::make(c, 16, 4 * c.max_tokens);
  graphs::StepSplitter splitter(c, layout);
  std::mt19937 rng(7);
  std::vector<std::int32_t> table(static_cast<std::size_t>(c.swa_blocks_per_request()), 0);
  std::vector<std::int32_t> ctable(static_cast<std::size_t>(c.compressed_blocks_per_request()), 0);
  std::vector<graphs::RequestInput> requests = random_step(rng, 6, c.max_tokens);
  for (auto& r : requests) {
    r.seq_len = std::min(r.seq_len, c.max_model_len);
    r.swa_blocks = table;
    for (int i = 1; i < graphs::kNumRatios; ++i) r.compressed_blocks[i] = ctable;
  }
  const graphs::StepSplit split = splitter.split(graphs::StepInput{requests});
  REQUIRE(split.status == graphs::RunStatus::ok);
  REQUIRE(split.chunks >= 2);
  std::vector<std::int32_t> words(static_cast<std::size_t>(encoder.layout().words));
  graphs::ChunkRows rows;
  int tokens = 0;
  int compressed[graphs::kNumRatios] = {0, 0, 0};
  for (int k = 0; k < split.chunks; ++k) {
    const graphs::ChunkInput chunk = splitter.chunk(k);
    // Blocks shared between requests are refused only for writes of one step into one block; the
    // table here maps every request to block 0, so check the chunk without the insert's rule.
    graphs::ChunkEncoder plain(c, false);
    const graphs::ChunkCheck checked = plain.check(chunk, 0b111);
    REQUIRE(checked.status == graphs::RunStatus::ok);
    plain.write(chunk, checked, 0b111, words.data(), rows);
    const auto* sc = reinterpret_cast<const kernels::ChunkScalars*>(words.data() + encoder.layout().scalars);
    for (int i = 0; i < graphs::kNumRatios; ++i) {
      INFO("chunk " << k << ", ratio index " << i);
      CHECK(sc[i].token_offset == tokens);
      CHECK(sc[i].new_row_offset == (i == 0 ? 0 : compressed[i]));
    }
    tokens += checked.tokens;
    for (const graphs::RequestInput& r : chunk.requests) {
      for (int i = 1; i < graphs::kNumRatios; ++i) compressed[i] += graphs::new_compressed_rows(r.seq_len, r.query_len, graphs::kRatios[i]);
    }
    rows = rows.next(checked);
    CHECK(rows.token_offset == tokens);
    for (int i = 1; i < graphs::kNumRatios; ++i) CHECK(rows.new_row_offset[i] == compressed[i]);
  }
  // A chunk written alone starts at row 0.
  const graphs::ChunkInput first = splitter.chunk(0);
  graphs::ChunkEncoder plain(c, false);
  const graphs::ChunkCheck checked = plain.check(first, 0b111);
  plain.write(first, checked, 0b111, words.data());
  const auto* sc = reinterpret_cast<const kernels::ChunkScalars*>(words.data() + encoder.layout().scalars);
  for (int i = 0; i < graphs::kNumRatios; ++i) CHECK((sc[i].token_offset == 0 && sc[i].new_row_offset == 0));
}

TEST_CASE("the header puts only a step's leading full chunks on the largest bucket; a later full chunk keeps its own, "
          "and buckets() are every chunk's own", "[cpu][step]") {
  model::PipelineConfig c = test::two_layer_config();
  const int R = c.max_requests;
  const int T = c.max_tokens;
  const int n = 2 + R;  // a full chunk of one request, R one-token requests, another full chunk
  const int per_swa = c.swa_blocks_per_request();
  const int per_comp = c.compressed_blocks_per_request();
  c.cache.swa_blocks = n * per_swa;
  c.cache.compressed_blocks = n * per_comp;
  const graphs::StepLayout layout = graphs::StepLayout::make(c, 16, 4 * T);
  const graphs::BucketSet buckets = graphs::BucketSet::make_default(R, T);
  graphs::ChunkEncoder encoder(c, true);
  graphs::StepStager stager(c, layout, buckets, encoder);
  std::vector<std::vector<std::int32_t>> swa(static_cast<std::size_t>(n));
  std::vector<std::vector<std::int32_t>> comp(static_cast<std::size_t>(n));
  std::vector<graphs::RequestInput> requests(static_cast<std::size_t>(n));
  for (int b = 0; b < n; ++b) {
    for (int i = 0; i < per_swa; ++i) swa[static_cast<std::size_t>(b)].push_back(b * per_swa + i);
    for (int i = 0; i < per_comp; ++i) comp[static_cast<std::size_t>(b)].push_back(b * per_comp + i);
    graphs::RequestInput& r = requests[static_cast<std::size_t>(b)];
    r.query_len = b == 0 || b == n - 1 ? T : 1;
    r.seq_len = r.query_len + 100 + b;
    r.swa_blocks = swa[static_cast<std::size_t>(b)];
    for (int i = 1; i < graphs::kNumRatios; ++i) r.compressed_blocks[i] = comp[static_cast<std::size_t>(b)];
  }
  constexpr int kMask = 0b011;
  REQUIRE(stager.fast_bucket() == buckets.lookup(R, T));
  const graphs::StepCheck checked = stager.check(graphs::StepInput{requests}, kMask);
  REQUIRE(checked.status == graphs::RunStatus::ok);
  REQUIRE(checked.chunks == 3);
  REQUIRE(stager.buckets().size() == 3);
  CHECK(stager.buckets()[0] == buckets.lookup(1, T));  // each chunk's own (a step of one chunk runs at it)
  CHECK(stager.buckets()[1] == buckets.lookup(R, R));
  CHECK(stager.buckets()[2] == buckets.lookup(1, T));
  std::vector<std::int32_t> block(layout.words(), 0x7F7F7F7F);
  stager.write(kMask, block.data());
  CHECK(block[kernels::StepStateWords::count] == 3);
  CHECK(block[kernels::StepStateWords::fast] == 1);
  CHECK(block[kernels::StepStateWords::buckets + 0] == stager.fast_bucket());   // (1, T) on (R, T)
  CHECK(block[kernels::StepStateWords::buckets + 1] == buckets.lookup(R, R));  // not full: the SWITCH loop
  CHECK(block[kernels::StepStateWords::buckets + 2] == buckets.lookup(1, T));  // full, but after one that is not
}

TEST_CASE("the step stager checks every chunk, then writes the header and each chunk's block on its rows",
          "[cpu][step]") {
  model::PipelineConfig c = test::two_layer_config();
  const int n = 11;
  const int per_swa = c.swa_blocks_per_request();
  const int per_comp = c.compressed_blocks_per_request();
  c.cache.swa_blocks = n * per_swa;  // every request owns its blocks: no block holds two requests' rows
  c.cache.compressed_blocks = n * per_comp;
  const graphs::StepLayout layout = graphs::StepLayout::make(c, 16, 4 * c.max_tokens);
  const graphs::BucketSet buckets = graphs::BucketSet::make_default(c.max_requests, c.max_tokens);
  graphs::ChunkEncoder encoder(c, true);
  graphs::StepStager stager(c, layout, buckets, encoder);
  std::mt19937 rng(11);
  std::vector<std::vector<std::int32_t>> swa(static_cast<std::size_t>(n));
  std::vector<std::vector<std::int32_t>> comp(static_cast<std::size_t>(n));
  std::vector<graphs::RequestInput> requests = random_step(rng, n, c.max_tokens / 2);
  for (int b = 0; b < n; ++b) {
    for (int i = 0; i < per_swa; ++i) swa[static_cast<std::size_t>(b)].push_back(b * per_swa + i);
    for (int i = 0; i < per_comp; ++i) comp[static_cast<std::size_t>(b)].push_back(b * per_comp + i);
    graphs::RequestInput& r = requests[static_cast<std::size_t>(b)];
    r.seq_len = std::min(r.seq_len, c.max_model_len);
    r.swa_blocks = swa[static_cast<std::size_t>(b)];
    for (int i = 1; i < graphs::kNumRatios; ++i) r.compressed_blocks[i] = comp[static_cast<std::size_t>(b)];
  }
  constexpr int kMask = 0b011;  // the config's ratios 1 and 4
  const graphs::StepCheck checked = stager.check(graphs::StepInput{requests}, kMask);
  REQUIRE(checked.status == graphs::RunStatus::ok);
  REQUIRE(checked.chunks >= 3);
  std::vector<std::int32_t> block(layout.words(), 0x7F7F7F7F);
  stager.write(kMask, block.data());
  CHECK(block[kernels::StepStateWords::count] == checked.chunks);
  REQUIRE(stager.buckets().size() == static_cast<std::size_t>(checked.chunks));

  // The same chunks, split, checked and written one by one on their rows.
  graphs::StepSplitter splitter(c, layout);
  REQUIRE(splitter.split(graphs::StepInput{requests}).chunks == checked.chunks);
  graphs::ChunkEncoder alone(c, true);
  graphs::ChunkRows rows;
  std::vector<std::int32_t> expected(static_cast<std::size_t>(layout.chunk_words));
  // The leading chunks of the largest T bucket run on the largest bucket (the first loop).
  int fast = 0;
  for (int k = 0; k < checked.chunks; ++k) {
    const graphs::ChunkCheck ck = alone.check(splitter.chunk(k), kMask);
    if (buckets.t_of(buckets.lookup(ck.requests, ck.tokens)) != c.max_tokens) break;
    ++fast;
  }
  REQUIRE(fast >= 1);  // the step's first chunk is full: the case below covers both loops
  REQUIRE(fast < checked.chunks);
  CHECK(block[kernels::StepStateWords::fast] == fast);
  for (int k = 0; k < checked.chunks; ++k) {
    INFO("chunk " << k);
    std::fill(expected.begin(), expected.end(), 0x7F7F7F7F);  // write() leaves unread words as they were
    const graphs::ChunkInput chunk = splitter.chunk(k);
    const graphs::ChunkCheck ck = alone.check(chunk, kMask);
    REQUIRE(ck.status == graphs::RunStatus::ok);
    const int own = buckets.lookup(ck.requests, ck.tokens);
    CHECK(stager.buckets()[static_cast<std::size_t>(k)] == own);
    CHECK(block[static_cast<std::size_t>(kernels::StepStateWords::buckets + k)] == (k < fast ? stager.fast_bucket() : own));
    alone.write(chunk, ck, kMask, expected.data(), rows);
    rows = rows.next(ck);
    const std::int32_t* got = block.data() + layout.chunk_offset(k);
    int mismatches = 0;
    for (std::size_t w = 0; w < expected.size(); ++w) mismatches += got[w] != expected[w] ? 1 : 0;
    CHECK(mismatches == 0);
  }

  // A refused chunk: named by its index and the request by the step's numbering; no buckets kept.
  const int bad = 7;
  swa[bad][static_cast<std::size_t>((requests[bad].seq_len - 1) / c.cache.swa_block_size)] = c.cache.swa_blocks;
  const graphs::StepCheck refused = stager.check(graphs::StepInput{requests}, kMask);
  CHECK(refused.status == graphs::RunStatus::bad_chunk);
  CHECK(refused.bad_request == bad);
  CHECK(std::string(refused.bad_field) == "swa_blocks");
  CHECK(contains(refused.bad_reason, "outside [0, cache.swa_blocks)"));
  int chunk_of_bad = -1;
  for (int k = 0; k < checked.chunks && chunk_of_bad < 0; ++k) {
    for (int b = 0; b < static_cast<int>(splitter.chunk(k).requests.size()); ++b) {
      if (splitter.request_of(k, b) == bad) chunk_of_bad = k;
    }
  }
  CHECK(refused.bad_chunk == chunk_of_bad);
  CHECK(refused.chunks == checked.chunks);
  CHECK(stager.buckets().empty());
  // A step the split refuses names no chunk.
  requests[3].query_len = 0;
  const graphs::StepCheck unsplit = stager.check(graphs::StepInput{requests}, kMask);
  CHECK(unsplit.status == graphs::RunStatus::bad_chunk);
  CHECK(unsplit.bad_chunk == -1);
  CHECK(unsplit.bad_request == 3);
  CHECK(std::string(unsplit.bad_field) == "query_len");
}
