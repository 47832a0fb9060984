// Table D (steps): whole steps of 1, 4 and 16 chunks in one launch, for a 1-layer and the 8-layer
// program: host time per step, cudaGraphLaunch alone, and the step's GPU time against its chunks
// run one by one and against the eager host loop (docs/benchmarks.md, "Steps in one launch").
#pragma once

#include "samples/bench/report.hpp"

namespace spg::bench {

void run_step_benchmarks(Reporter& reporter);

}  // namespace spg::bench
