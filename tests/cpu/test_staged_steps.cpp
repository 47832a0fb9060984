// Staged steps (Executor::stage / run_staged, docs/graphs.md "Staged steps"), the host side: which
// launches read the staging block, which run what the device state holds, and when nothing is
// staged. Hidden ([.stub]): these cases build, warm up and launch a real Executor, so they run only
// in the stub_runtime_tests CTest entry, under scripts/cudart_stub.cpp (a CUDA runtime in which
// every call succeeds and no kernel runs). What the device computes is the GPU tests' part
// (tests/gpu/test_step.cpp); here only the host's decisions are checked, through the executor's
// counters and results.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/small_configs.hpp"
#include "spgraph/graphs/executor.hpp"

using namespace spg;

namespace {

bool under_stub() {
  const char* v = std::getenv("SPGRAPH_CUDART_STUB");
  return v != nullptr && std::string(v) == "1";
}

/// two_layer_config() (C4A h64, SWA-only; R 4, T 64), one program per layer, steps of up to 8
/// requests and 256 tokens (at most 12 chunks), all-full steps of up to 4 chunks flat.
graphs::ExecutorOptions options(int flat = 4, bool pad = false) {
  graphs::ExecutorOptions o;
  o.programs = {{0}, {1}};
  o.max_step_requests = 8;
  o.max_step_tokens = 256;
  o.flat_step_chunks = flat;
  o.flat_step_pad = pad;
  return o;
}

/// A step of `queries.size()` requests, each of the given new tokens after 100 cached, its blocks
/// its own (SWA block size 64: 6 blocks a request; compressed: 1 block of 512 rows at ratio 4).
struct Step {
  std::vector<graphs::RequestInput> requests;
  std::vector<std::vector<std::int32_t>> swa, compressed;
  explicit Step(const std::vector<int>& queries, bool with_compressed = true) {
    const std::size_t n = queries.size();
    swa.resize(n);
    compressed.resize(n);
    requests.resize(n);
    for (std::size_t b = 0; b < n; ++b) {
      graphs::RequestInput& r = requests[b];
      r.query_len = queries[b];
      r.seq_len = 100 + queries[b];
      for (int i = 0; i < (r.seq_len + 63) / 64; ++i) swa[b].push_back(static_cast<int>(b) * 12 + i);
      if (with_compressed) compressed[b].push_back(static_cast<int>(b));
      r.swa_blocks = swa[b];
      r.compressed_blocks[graphs::ratio_index(4)] = compressed[b];
    }
  }
  [[nodiscard]] graphs::StepInput input() const { return graphs::StepInput{requests}; }
};

void require_ok(const graphs::RunResult& r) {
  INFO("status " << graphs::run_status_name(r.status) << (r.bad_field != nullptr ? std::string(", ") + r.bad_field : ""));
  REQUIRE(r.ok());
}

}  // namespace

TEST_CASE("a staged step's first run reads its staging block, every later run the device state, for any program",
          "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), options());
  const graphs::WarmupReport w = ex.warmup();
  // Per program the rerun step graph and its flat graphs of 2 .. 4 chunks; the plain graphs of
  // one chunk, per bucket for both staging blocks and the reruns.
  CHECK(w.staged_step_graphs == 2 * (1 + 3));
  CHECK(w.staged_one_chunk_graphs == 2 * 3 * ex.buckets().size());
  CHECK(ex.staged_chunks() == -1);

  // 215 tokens: [64] [30, 34] [16, 7, 41] [23]: the last chunk is not full, so the step graph.
  const Step mixed({64, 30, 50, 7, 64});
  const std::uint64_t steps = ex.steps();
  const graphs::RunResult staged = ex.stage(mixed.input());
  require_ok(staged);
  CHECK(staged.chunks == 4);
  CHECK(ex.staged_chunks() == 4);
  CHECK(ex.steps() == steps);  // stage() launches nothing
  for (const int program : {0, 1, 0, 1, 1}) {
    const graphs::RunResult r = ex.run_staged(program);
    require_ok(r);
    CHECK(r.chunks == 4);
    CHECK(r.bucket == -1);
  }
  CHECK(ex.steps() == steps + 5);
  CHECK(ex.staged_reruns() == 4);  // all but the first
  CHECK(ex.flat_steps() == 0);
  require_ok(ex.run_staged_eager(0));
  CHECK(ex.staged_reruns() == 5);

  // A chunk run in between leaves the staged step where it is (it reads and writes no step state).
  const Step one({10});
  graphs::ChunkInput chunk;
  chunk.requests = one.requests;
  require_ok(ex.run(chunk, 0));
  require_ok(ex.run_staged(1));
  CHECK(ex.staged_reruns() == 6);

  // Staging another step: its first run loads it, then reruns again.
  require_ok(ex.stage(Step({20, 20}).input()));
  CHECK(ex.staged_chunks() == 1);
  require_ok(ex.run_staged(0));
  CHECK(ex.staged_reruns() == 6);
  require_ok(ex.run_staged(1));
  CHECK(ex.staged_reruns() == 7);
  // A step of no requests stages and runs too (its launches run no chunk).
  require_ok(ex.stage(graphs::StepInput{}));
  CHECK(ex.staged_chunks() == 0);
  require_ok(ex.run_staged(0));
  require_ok(ex.run_staged(1));
  CHECK(ex.staged_reruns() == 8);
}

TEST_CASE("an all-full staged step within flat_step_chunks runs its flat graph, first run and reruns", "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), options());
  ex.warmup();
  require_ok(ex.stage(Step({64, 64, 64}).input()));  // three chunks of 64 tokens: all full
  CHECK(ex.staged_chunks() == 3);
  require_ok(ex.run_staged(0));
  require_ok(ex.run_staged(1));
  require_ok(ex.run_staged(1));
  CHECK(ex.flat_steps() == 3);
  CHECK(ex.staged_reruns() == 2);
  require_ok(ex.run_staged_eager(0));  // eager: never the flat graph
  CHECK(ex.flat_steps() == 3);
  // One chunk, staged, full or not: the plain graph of its bucket (run(StepInput) launches it as
  // a chunk, which counts no flat step).
  require_ok(ex.stage(Step({64}).input()));
  require_ok(ex.run_staged(0));
  require_ok(ex.run_staged(1));
  require_ok(ex.stage(Step({10}).input()));
  require_ok(ex.run_staged(0));
  CHECK(ex.flat_steps() == 6);
  const graphs::RunResult one = ex.run(Step({64}).input(), 0);
  require_ok(one);
  CHECK(one.bucket >= 0);  // launched as a chunk
  CHECK(ex.flat_steps() == 6);
  // Steps of several chunks that are not all full: the step graph.
  require_ok(ex.stage(Step({64, 64, 10}).input()));
  CHECK(ex.staged_chunks() == 3);
  require_ok(ex.run_staged(0));
  require_ok(ex.run_staged(1));
  CHECK(ex.flat_steps() == 6);
  // Four full chunks: the largest flat graph, loaded and rerun; five, over flat_step_chunks: the
  // step graph.
  require_ok(ex.stage(Step({64, 64, 64, 64}).input()));
  require_ok(ex.run_staged(1));
  require_ok(ex.run_staged(0));
  CHECK(ex.flat_steps() == 8);
  const Step five({64, 64, 64, 10, 10, 10, 10, 10});  // [64] [64] [64] [10 x 4] [10]
  require_ok(ex.stage(five.input()));
  CHECK(ex.staged_chunks() == 5);
  require_ok(ex.run_staged(0));
  CHECK(ex.flat_steps() == 8);
}

TEST_CASE("with flat_step_pad every step within flat_step_chunks runs its flat graph, full or not", "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), options(4, /*pad=*/true));
  const graphs::WarmupReport w = ex.warmup();
  CHECK(w.flat_step_graphs == 2 * 2 * 3);  // programs x step staging blocks x 2 .. 4 chunks
  CHECK(w.staged_step_graphs == 2 * (1 + 3));
  // Not all full: [64] [30, 34] [16, 7, 41] [23]; through run(StepInput) and staged.
  const Step mixed({64, 30, 50, 7, 64});
  const graphs::RunResult r = ex.run(mixed.input(), 1);
  require_ok(r);
  CHECK(r.chunks == 4);
  CHECK(ex.flat_steps() == 1);
  require_ok(ex.stage(mixed.input()));
  require_ok(ex.run_staged(0));
  require_ok(ex.run_staged(1));
  CHECK(ex.flat_steps() == 3);
  // One chunk that is not full: staged, its bucket's plain graph; through run(StepInput), a chunk.
  require_ok(ex.stage(Step({10}).input()));
  require_ok(ex.run_staged(1));
  CHECK(ex.flat_steps() == 4);
  require_ok(ex.run(Step({10}).input(), 0));
  CHECK(ex.flat_steps() == 4);
  // Over flat_step_chunks, and no chunk at all: the step graph; eager: never a flat graph.
  const graphs::RunResult five = ex.run(Step({64, 64, 64, 10, 10, 10, 10, 10}).input(), 0);
  require_ok(five);
  CHECK(five.chunks == 5);
  require_ok(ex.run(graphs::StepInput{}, 0));
  require_ok(ex.run_eager(mixed.input(), 0));
  CHECK(ex.flat_steps() == 4);
  CHECK(ex.steps() == 8);  // every launch: 7 through run() and run_staged(), 1 eager
}

TEST_CASE("run_staged without a staged step is refused as not_staged; only an accepted run of a step replaces one",
          "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), options());
  // Before warm-up stage() is refused like run(StepInput).
  CHECK(ex.stage(Step({10}).input()).status == graphs::RunStatus::not_warmed_up);
  ex.warmup();
  CHECK(ex.run_staged(0).status == graphs::RunStatus::not_staged);
  CHECK(ex.run_staged_eager(1).status == graphs::RunStatus::not_staged);
  const std::uint64_t steps = ex.steps();
  const Step s({40, 40, 40});
  require_ok(ex.stage(s.input()));
  CHECK(ex.run_staged(2).status == graphs::RunStatus::bad_program);
  CHECK(ex.run_staged(-1).status == graphs::RunStatus::bad_program);
  CHECK(ex.steps() == steps);

  // A refused step (more tokens than max_step_tokens) writes nothing: the staged step stays.
  const Step over({64, 64, 64, 64, 64});  // 320 tokens > 256
  const graphs::RunResult refused_run = ex.run(over.input(), 0);
  CHECK(refused_run.status == graphs::RunStatus::no_bucket);
  const graphs::RunResult refused_stage = ex.stage(over.input());
  CHECK(refused_stage.status == graphs::RunStatus::no_bucket);
  CHECK(std::string(refused_stage.bad_field) == "step.tokens");
  CHECK(ex.staged_chunks() == 2);
  require_ok(ex.run_staged(0));

  // An accepted run of a step loads its own into the device state: the staged one is gone.
  require_ok(ex.run(Step({5, 6}).input(), 1));
  CHECK(ex.staged_chunks() == -1);
  CHECK(ex.run_staged(0).status == graphs::RunStatus::not_staged);
  require_ok(ex.stage(s.input()));
  require_ok(ex.run_eager(Step({5}).input(), 0));  // eager too, and a step of one chunk too
  CHECK(ex.run_staged(0).status == graphs::RunStatus::not_staged);
  CHECK(ex.steps() == steps + 3);
}

TEST_CASE("stage() checks every program's compression ratios: a step one program could run may be refused",
          "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), options());
  ex.warmup();
  // No compressed tables: program 1 (SWA only) runs the step, but program 0 (C4A) needs them.
  const Step swa_only({30, 30}, /*with_compressed=*/false);
  require_ok(ex.run(swa_only.input(), 1));
  const graphs::RunResult r = ex.stage(swa_only.input());
  CHECK(r.status == graphs::RunStatus::bad_chunk);
  REQUIRE(r.bad_field != nullptr);
  CHECK(std::string(r.bad_field) == "compressed_blocks");
  CHECK(r.bad_chunk == 0);
  CHECK(r.bad_request == 0);
  CHECK(ex.staged_chunks() == -1);
}

TEST_CASE("an executor without steps stages nothing", "[.stub][step]") {
  REQUIRE(under_stub());
  graphs::Executor ex(test::two_layer_config(), graphs::ExecutorOptions{});
  const graphs::WarmupReport w = ex.warmup();
  CHECK(w.staged_step_graphs == 0);
  CHECK(ex.stage(Step({10}).input()).status == graphs::RunStatus::not_warmed_up);
  CHECK(ex.run_staged(0).status == graphs::RunStatus::not_warmed_up);
}
