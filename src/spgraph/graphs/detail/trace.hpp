// NVTX ranges of the "spgraph" domain: the executor's planning and warm-up phases, each step, and
// each stage of an eager step, so that Nsight Systems shows where the host's time goes
// (docs/graphs.md, "Profiling"). Names are registered with NVTX once. With no tool attached NVTX
// leaves its function pointers null after the first call, so a range costs a few loads and branches at
// each end; building with NVTX_DISABLE defined removes even that.
#pragma once

#include <nvtx3/nvtx3.hpp>

#include <cstdint>
#include <utility>

namespace spg::graphs::detail {

struct TraceDomain {
  static constexpr const char* name{"spgraph"};
};

/// @brief What a range times. The names (trace_name) are what a profiler shows.
enum class TracePhase : int {
  plan,         ///< plan_executor: the config, buckets, programs, bindings and pool plan (host only)
  warmup,       ///< Executor::warmup, the whole of it
  prepare,      ///< warm-up: every (program, bucket)'s Pipeline built and checked
  eager_pass,   ///< warm-up: one eager run of every shape
  capture,      ///< warm-up: one graph captured (payload: the bucket)
  instantiate,  ///< warm-up: one graph instantiated and uploaded (payload: the bucket)
  step_graph,   ///< Executor::run: checks, staging, graph launch
  step_eager,   ///< Executor::run_eager: checks, staging, the launches of every stage
  stage_in,     ///< an eager step's stage-in kernel
  insert_swa,   ///< an eager step's stages, payload: the layer's index in the program
  insert_compressed,
  gather,
  combine,
  attention,
};
inline constexpr int kTracePhases = static_cast<int>(TracePhase::attention) + 1;

/// The name a profiler shows for `p` ("warmup: capture", "stage: gather", ...).
[[nodiscard]] constexpr const char* trace_name(TracePhase p) noexcept {
  switch (p) {
    case TracePhase::plan: return "plan";
    case TracePhase::warmup: return "warmup";
    case TracePhase::prepare: return "warmup: prepare";
    case TracePhase::eager_pass: return "warmup: eager pass";
    case TracePhase::capture: return "warmup: capture";
    case TracePhase::instantiate: return "warmup: instantiate";
    case TracePhase::step_graph: return "step: graph";
    case TracePhase::step_eager: return "step: eager";
    case TracePhase::stage_in: return "stage: stage-in";
    case TracePhase::insert_swa: return "stage: insert-swa";
    case TracePhase::insert_compressed: return "stage: insert-compressed";
    case TracePhase::gather: return "stage: gather";
    case TracePhase::combine: return "stage: combine";
    case TracePhase::attention: return "stage: attention";
  }
  return "?";
}

template <int... I>
[[nodiscard]] const nvtx3::registered_string_in<TraceDomain>& trace_handle(TracePhase p,
                                                                          std::integer_sequence<int, I...>) noexcept {
  using Name = nvtx3::registered_string_in<TraceDomain>;
  static const Name names[] = {Name{trace_name(static_cast<TracePhase>(I))}...};
  return names[static_cast<int>(p)];
}

/// The registered handle of `p`'s name (every name registered on first use, once per process).
[[nodiscard]] inline const nvtx3::registered_string_in<TraceDomain>& trace_handle(TracePhase p) noexcept {
  return trace_handle(p, std::make_integer_sequence<int, kTracePhases>{});
}

/// @brief One NVTX range on the calling thread, from construction to destruction (so balanced on
///        every exit path, exceptions included). Not movable: it lives in one scope.
class TraceRange {
 public:
  explicit TraceRange(TracePhase p) noexcept : range_{nvtx3::event_attributes{trace_handle(p)}} {}
  TraceRange(TracePhase p, std::int64_t payload) noexcept
      : range_{nvtx3::event_attributes{trace_handle(p), nvtx3::payload{payload}}} {}

 private:
  nvtx3::scoped_range_in<TraceDomain> range_;
};

}  // namespace spg::graphs::detail
