// The run's fault totals (kernels::RunFaults): how a step's counters fold in, as the stage-in
// kernel folds them on the device and Executor::read_run_faults adds the last step's.
#include "common/catch.hpp"
#include "spgraph/kernels/step_status.hpp"

using spg::kernels::Fault;
using spg::kernels::RunFaults;
using spg::kernels::StatusBlock;
using spg::kernels::StepStatus;

TEST_CASE("a run's fault totals keep every step's counts and the first fault", "[faults]") {
  RunFaults run{};
  StepStatus clean{};
  run.add(clean);
  CHECK(run.total() == 0);
  CHECK(run.faulty_steps == 0);
  CHECK(run.recorded == 0);

  StepStatus bad{};
  bad.counts[static_cast<int>(Fault::topk_index)] = 3;
  bad.recorded = 1;
  bad.first = {static_cast<int>(Fault::topk_index), 0, 5, 9999};
  run.add(bad);
  run.add(clean);
  StepStatus later{};
  later.counts[static_cast<int>(Fault::block_id)] = 2;
  later.counts[static_cast<int>(Fault::topk_index)] = 1;
  later.recorded = 1;
  later.first = {static_cast<int>(Fault::block_id), 1, 70, -4};
  run.add(later);
  CHECK(run.total() == 6);
  CHECK(run.count(Fault::topk_index) == 4);
  CHECK(run.count(Fault::block_id) == 2);
  CHECK(run.faulty_steps == 2);
  REQUIRE(run.recorded == 1);
  CHECK(run.first.kind == static_cast<int>(Fault::topk_index));  // the run's first, not the last step's
  CHECK(run.first.value == 9999);
}

TEST_CASE("the status block keeps the step's counters where every kernel writes them", "[faults]") {
  StatusBlock b{};
  CHECK(static_cast<void*>(&b) == static_cast<void*>(&b.step));  // kernels get &block.step == &block
  CHECK(reinterpret_cast<char*>(&b.run) - reinterpret_cast<char*>(&b) == 64);
}
