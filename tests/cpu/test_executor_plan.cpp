// The executor's host-side planning (plan_executor) and the order its constructor validates in:
// every config, bucket, program and binding error is an InvalidArgument naming the field, raised
// before any CUDA call and before anything is sized from the bad value. On a machine without a
// GPU (CI) any CUDA call fails with a CudaError, so a CudaError here means a call came first.
#include <chrono>
#include <climits>
#include <string>
#include <vector>

#include "common/catch.hpp"
#include "common/small_configs.hpp"
#include "spgraph/core/error.hpp"
#include "spgraph/graphs/executor.hpp"
#include "spgraph/graphs/pipeline_pool.hpp"

using namespace spg;

namespace {

/// What the constructor throws for (config, options): the InvalidArgument's message, "accepted",
/// or a failure when a CUDA call (CudaError) or anything else came first. Also times it.
struct Outcome {
  std::string message;
  double seconds{0};
};

Outcome construct(const model::PipelineConfig& c, const graphs::ExecutorOptions& o = {}) {
  const auto t0 = std::chrono::steady_clock::now();
  Outcome out;
  try {
    graphs::Executor ex(c, o);
    out.message = "accepted";
  } catch (const InvalidArgument& e) {
    out.message = e.what();
  } catch (const CudaError& e) {
    out.message = std::string("a CUDA call came before the config was checked: ") + e.what();
  } catch (const std::exception& e) {
    out.message = std::string("not an InvalidArgument: ") + e.what();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::string planned(const model::PipelineConfig& c, const graphs::ExecutorOptions& o = {}) {
  try {
    (void)graphs::plan_executor(c, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "accepted";
}

void expect_refused(const model::PipelineConfig& c, const graphs::ExecutorOptions& o, const std::string& part) {
  const Outcome out = construct(c, o);
  INFO(out.message);
  CHECK(out.message.find(part) != std::string::npos);
  // Issue 17: max_requests = INT_MAX took 18.6 s and 4 GiB before its message; max_tokens =
  // INT_MAX looped until std::bad_alloc. A refusal is immediate.
  CHECK(out.seconds < 2.0);
  const std::string plan = planned(c, o);
  INFO(plan);
  CHECK(plan.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("the executor validates the config before sizing anything from it, with no CUDA call", "[executor][plan]") {
  const graphs::ExecutorOptions none;
  auto c = test::two_layer_config();
  c.max_tokens = INT_MAX;
  expect_refused(c, none, "max_tokens = 2147483647 must be in [1, 65536]");
  c = test::two_layer_config();
  c.max_requests = INT_MAX;
  expect_refused(c, none, "max_requests = 2147483647 must be in [1, 64]");
  c = test::two_layer_config();
  c.max_tokens = 0;  // was "t_buckets[0] = 0 must be in [1, 0]"
  expect_refused(c, none, "max_tokens = 0 must be in [1, 65536]");
  c = test::two_layer_config();
  c.max_requests = -3;
  expect_refused(c, none, "max_requests = -3 must be in [1, 64]");
  c = test::two_layer_config();
  c.max_model_len = INT_MAX;
  expect_refused(c, none, "max_model_len = 2147483647 must be in [1, 1048576]");
  c = test::two_layer_config();
  c.layers[1].h_q = 0;
  expect_refused(c, none, "layers[1].h_q = 0 must be 64 or 128");
  c = test::two_layer_config();
  c.cache.swa_blocks = 0;
  expect_refused(c, none, "cache.swa_blocks = 0 must be at least 1");
  c = test::two_layer_config();
  c.max_requests = 64;
  c.max_model_len = 1 << 20;
  c.cache.swa_block_size = 1;  // a 256 MiB metadata block per step
  expect_refused(c, none, "the chunk metadata's block tables");
}

TEST_CASE("bucket lists and programs are checked after the config and before any CUDA call", "[executor][plan]") {
  const auto c = test::two_layer_config();
  graphs::ExecutorOptions o;
  o.t_buckets = {16, 999999};
  expect_refused(c, o, "t_buckets[1] = 999999 must be in [1, 64]");
  o.t_buckets = {INT_MAX};
  expect_refused(c, o, "t_buckets[0] = 2147483647 must be in [1, 64]");
  o.t_buckets = {32, 16, 64};
  expect_refused(c, o, "t_buckets[1] = 16 must be larger than t_buckets[0] = 32");
  o.t_buckets = {16, 32};
  expect_refused(c, o, "t_buckets ends at 32 but must end at the maximum 64");
  o.t_buckets = {};
  o.r_buckets = {0, 4};
  expect_refused(c, o, "r_buckets[0] = 0 must be in [1, 4]");
  o.r_buckets = std::vector<int>(65, 1);
  expect_refused(c, o, "r_buckets holds 65 buckets, at most 64");
  o.r_buckets = {};
  o.programs = {{0, 1}, {}};
  expect_refused(c, o, "programs[1] is empty");
  o.programs = {{0, 2}};
  expect_refused(c, o, "programs[0] names layer 2; layers are 0 .. 1");
  o.programs = {{-1}};
  expect_refused(c, o, "programs[0] names layer -1");
  // A config error is reported before an options error.
  auto bad = c;
  bad.max_tokens = 0;
  expect_refused(bad, o, "max_tokens = 0 must be in [1, 65536]");
}

TEST_CASE("plan_executor sizes an executor without a device", "[executor][plan]") {
  const auto c = test::two_layer_config();
  graphs::ExecutorOptions o;
  o.programs = {{0, 1}, {1}};
  const graphs::ExecutorPlan plan = graphs::plan_executor(c, o);
  CHECK(plan.config.max_tokens == 64);
  CHECK(plan.buckets.t_buckets().back() == 64);
  CHECK(plan.buckets.r_buckets().back() == 4);
  REQUIRE(plan.programs.size() == 2);
  CHECK(plan.program_ratios == std::vector<int>{1 << 0 | 1 << 1, 1 << 0});
  CHECK(plan.pool.find(graphs::slots::kChunkMeta) != nullptr);
  CHECK(plan.pool.find(graphs::slots::kAttentionWorkspace) == nullptr);  // carved at warm-up
  CHECK(plan.pool.device_bytes() == graphs::plan_pipeline_pool(c).device_bytes());
}
