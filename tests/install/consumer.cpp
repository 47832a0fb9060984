// Plans the default V4 pool through the installed headers and library, on the CPU.
#include <cstdio>

#include <spgraph/graphs/pipeline_pool.hpp>
#include <spgraph/model/pipeline_config.hpp>

int main() {
  const auto config = spg::model::PipelineConfig::v4_default();
  const auto plan = spg::graphs::plan_pipeline_pool(config);
  std::printf("consumer: %zu slots, %zu device bytes\n", plan.slots().size(), plan.device_bytes());
  return plan.device_bytes() > 0 ? 0 : 1;
}
