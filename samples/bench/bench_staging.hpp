// Table S (staging, host only): the host work of run(StepInput) up to its launch, the split of the
// step, every chunk's check and bucket, and the writes of the step staging block (graphs::StepStager),
// for table D's steps of 1, 4 and 16 chunks of the 1-layer and 8-layer programs, into plain host
// memory. Needs no GPU (docs/benchmarks.md, "Steps in one launch").
#pragma once

#include "samples/bench/report.hpp"

namespace spg::bench {

/// Medians of `reps` repetitions of each phase (steady_clock around each call), warm; and of
/// max(5, reps / 100) stagings after the caches and TLBs were flushed (staging_us_cold). The
/// six rows take turns in 20 rounds.
void run_staging_benchmarks(Reporter& reporter, int reps);

}  // namespace spg::bench
