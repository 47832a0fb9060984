// The executor's NVTX ranges on a device, seen through the test binaries' static NVTX injection
// (tests/common/nvtx_recorder.hpp): warm-up's phases, an eager step's stages in recording order
// with the layer as payload, and a replayed step's single range; all balanced.
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/nvtx_recorder.hpp"
#include "executor_test_util.hpp"
#include "spgraph/graphs/executor.hpp"

using namespace spg;
using test::NvtxRange;
using test::NvtxRecorder;

namespace {

int count(const std::vector<NvtxRange>& ranges, const std::string& name, int depth) {
  int n = 0;
  for (const NvtxRange& r : ranges) n += r.name == name && r.depth == depth ? 1 : 0;
  return n;
}

void require_balanced() {
  CHECK(NvtxRecorder::open() == 0);
  CHECK_FALSE(NvtxRecorder::underflow());
}

}  // namespace

TEST_CASE("warm-up, an eager step and a replayed step show as named, balanced NVTX ranges", "[gpu][trace]") {
  graphs::ExecutorOptions o;
  o.insert = true;
  graphs::Executor ex(test::small_program(), o);
  test::World world(ex, 5);
  const test::ChunkData c = world.random_chunk(2, 10);
  world.randomize_topk(c);

  NvtxRecorder::clear();
  const graphs::WarmupReport report = ex.warmup();
  REQUIRE(NvtxRecorder::attached());
  std::vector<NvtxRange> ranges = NvtxRecorder::pushed();
  require_balanced();
  REQUIRE_FALSE(ranges.empty());
  CHECK(ranges.front().name == "warmup");
  CHECK(count(ranges, "warmup", 0) == 1);
  CHECK(count(ranges, "warmup: prepare", 1) == 1);
  CHECK(count(ranges, "warmup: eager pass", 1) == 1);
  CHECK(count(ranges, "warmup: capture", 1) == report.graphs);
  CHECK(count(ranges, "warmup: instantiate", 1) == report.graphs);
  const int shapes = report.programs * report.buckets;
  CHECK(count(ranges, "stage: stage-in", 2) == shapes + report.graphs);  // the eager pass, then every capture

  NvtxRecorder::clear();
  REQUIRE(ex.run_eager(c.input()).ok());
  ranges = NvtxRecorder::pushed();
  require_balanced();
  // The step, then its stages in recording order, each naming its layer.
  std::vector<std::string> expected = {"step: eager/-1", "stage: stage-in/-1"};
  const std::vector<int>& layers = ex.program_layers(0);
  for (int l : layers) {
    expected.push_back("stage: insert-swa/" + std::to_string(l));
    if (ex.config().layers[static_cast<std::size_t>(l)].compress_ratio > 1) {
      expected.push_back("stage: insert-compressed/" + std::to_string(l));
    }
    for (const char* s : {"stage: gather/", "stage: combine/", "stage: attention/"}) {
      expected.push_back(s + std::to_string(l));
    }
  }
  std::vector<std::string> seen;
  for (const NvtxRange& r : ranges) {
    seen.push_back(r.name + "/" + std::to_string(r.payload));
    CHECK(r.depth == (r.name == "step: eager" ? 0 : 1));
  }
  CHECK(seen == expected);

  NvtxRecorder::clear();
  REQUIRE(ex.run(c.input()).ok());
  ranges = NvtxRecorder::pushed();
  require_balanced();
  REQUIRE(ranges.size() == 1);
  CHECK(ranges[0].name == "step: graph");
  ex.synchronize();
}
