// Table D (steps): whole steps of 1, 4 and 16 chunks in one launch, for a 1-layer and the 8-layer
// program: host time per step, cudaGraphLaunch alone, and the step's GPU time against its chunks
// run one by one and against the eager host loop (docs/benchmarks.md, "Steps in one launch").
#pragma once

#include "samples/bench/report.hpp"

namespace spg::bench {

void run_step_benchmarks(Reporter& reporter);
/// Table R: where the launch cost that grows with a step exec's last run is paid (rows
/// launch-probe/relaunch/...): after a synchronization, after cudaGraphUpload, after 2 ms idle,
/// and another exec queued behind it; 1 / 4 / 16 chunks of the 8-layer program.
void run_relaunch_probe(Reporter& reporter);

}  // namespace spg::bench
