// What one step's run() reports: the replay path returns a status, never throws (docs/errors.md).
#pragma once

namespace spg::graphs {

enum class RunStatus {
  ok,
  no_bucket,       ///< more requests or tokens than the largest bucket (a step: than max_step_requests / tokens)
  bad_chunk,       ///< lengths, block tables or slots inconsistent with the config (nothing written)
  bad_program,     ///< no such program
  not_warmed_up,   ///< warmup() has not run (or capture was disabled for run(), or the executor has no steps)
  cuda_error,      ///< a CUDA call failed; see RunResult::cuda
  not_staged,      ///< run_staged(): no step staged (stage() has not accepted one, or a run(StepInput) replaced it)
};

[[nodiscard]] const char* run_status_name(RunStatus s) noexcept;

}  // namespace spg::graphs
