// Tables B and D of docs/benchmarks.md: one chunk through every stage (graph replay against the
// same kernels launched eagerly and against the kernels' standalone sum), and executor warm-up.
#pragma once

#include <string>

#include "samples/bench/report.hpp"
#include "spgraph/graphs/executor.hpp"

namespace spg::bench {

/// Table B: the tiny, small, medium, large and model workloads.
void run_pipeline_benchmarks(Reporter& reporter, bool quick);
/// Runs the "small" workload once through a graph and writes its inputs (caches after insert,
/// block tables, lengths, q, top-k indices, sinks) and outputs to `dir` as raw files plus
/// manifest.json, for the PyTorch peer's cross-check (scripts/torch_peer.py --check).
void dump_small_workload(const std::string& dir);
/// Table D (warm-up half): capture time, graph count and memory for the default V4 program.
void run_executor_benchmarks(Reporter& reporter);
/// Every layer's caches full of random data, every row of its q buffer (a whole step's with
/// steps) and its sinks, on the executor's stream (the sinks copied synchronously). Tables B and D
/// run the synthetic front after it for the K rows and top-k indices.
void fill_layer_inputs(graphs::Executor& ex);

}  // namespace spg::bench
