// The NVTX ranges of the "spgraph" domain (src/spgraph/graphs/detail/trace.hpp), seen through the test
// binaries' static NVTX injection (tests/common/nvtx_recorder.hpp): named as documented, and
// balanced on every exit path, exceptions included. The warm-up and eager-step ranges need a
// device: tests/gpu/test_trace.cpp.
#include <set>
#include <string>

#include "common/catch.hpp"
#include "common/nvtx_recorder.hpp"
#include "common/small_configs.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/detail/trace.hpp"
#include "spgraph/graphs/executor.hpp"

using namespace spg;
using graphs::detail::TracePhase;
using test::NvtxRecorder;

TEST_CASE("every trace phase has its own name", "[trace]") {
  std::set<std::string> names;
  for (int p = 0; p < graphs::detail::kTracePhases; ++p) {
    const std::string name = graphs::detail::trace_name(static_cast<TracePhase>(p));
    CHECK(name != "?");
    names.insert(name);
  }
  CHECK(names.size() == static_cast<std::size_t>(graphs::detail::kTracePhases));
}

TEST_CASE("a trace range is one balanced push and pop in the spgraph domain, with its payload", "[trace]") {
  NvtxRecorder::clear();
  {
    const graphs::detail::TraceRange outer(TracePhase::warmup);
    const graphs::detail::TraceRange inner(TracePhase::capture, 7);
    CHECK(NvtxRecorder::open() == 2);
  }
  REQUIRE(NvtxRecorder::attached());
  const auto pushed = NvtxRecorder::pushed();
  REQUIRE(pushed.size() == 2);
  CHECK(pushed[0].name == "warmup");
  CHECK(pushed[0].depth == 0);
  CHECK(pushed[0].payload == -1);
  CHECK(pushed[1].name == "warmup: capture");
  CHECK(pushed[1].depth == 1);
  CHECK(pushed[1].payload == 7);
  CHECK(NvtxRecorder::open() == 0);
  CHECK(NvtxRecorder::pops() == 2);
  CHECK_FALSE(NvtxRecorder::underflow());
}

TEST_CASE("plan_executor is one balanced 'plan' range, also when it refuses the config", "[trace]") {
  const model::PipelineConfig good = test::two_layer_config();
  model::PipelineConfig bad = good;
  bad.max_tokens = 0;
  const bool refuse = GENERATE(false, true);
  CAPTURE(refuse);
  NvtxRecorder::clear();
  if (refuse) {
    CHECK_THROWS_AS(graphs::plan_executor(bad, {}), InvalidArgument);
  } else {
    CHECK_NOTHROW((void)graphs::plan_executor(good, {}));
  }
  REQUIRE(NvtxRecorder::attached());
  const auto pushed = NvtxRecorder::pushed();
  REQUIRE(pushed.size() == 1);
  CHECK(pushed[0].name == "plan");
  CHECK(pushed[0].depth == 0);
  CHECK(NvtxRecorder::open() == 0);
  CHECK(NvtxRecorder::pops() == 1);
  CHECK_FALSE(NvtxRecorder::underflow());
}
