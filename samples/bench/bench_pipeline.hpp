// Tables B and D of docs/benchmarks.md: one chunk through every stage (graph replay against the
// same kernels launched eagerly and against the kernels' standalone sum), and executor warm-up.
#pragma once

#include "samples/bench/report.hpp"

namespace spg::bench {

/// Table B: the tiny, small, medium, large and model workloads.
void run_pipeline_benchmarks(Reporter& reporter, bool quick);
/// Table D (warm-up half): capture time, graph count and memory for the default V4 program.
void run_executor_benchmarks(Reporter& reporter);

}  // namespace spg::bench
