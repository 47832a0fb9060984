// Per-step fault counters that the data-dependent kernels fill and the host reads after a step.
//
// Per-step values are data in device memory, so a bad value (a top-k index past the request's
// rows; a block id or slot the host did not stage through the executor's checks) can only be
// found on the device. The kernels never read or write out of bounds because of one: they skip
// the element, count it here by kind, and the first fault of the step claims `first`. In an
// executor's step the stage-in kernel first adds the previous step's counts into the run's totals
// (RunFaults, beside the step's block in a StatusBlock) and then zeroes them, so counts are per
// step and the totals cover the whole run without a node of their own. Rules: docs/pipeline.md,
// "Bad input".
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace spg::kernels {

/// @brief What a kernel skipped. Each op counts what it skips itself, so a bad request seen by two
///        ops of a step is counted twice.
enum class Fault : std::int32_t {
  scalars = 0,     ///< a per-step count or bound outside its bucket (num_requests, num_tokens, num_rows,
                   ///< N > M, M > M_max, query_start_loc not ascending from 0): the op writes nothing
                   ///< (combine writes lens = 0); counted once per launch
  seq_len = 1,     ///< a request whose lengths do not fit (rows past the block table's width, past N or
                   ///< M, gather_len outside its range, query_len > seq_len): the request is skipped;
                   ///< counted once per request per launch
  block_id = 2,    ///< a block table entry outside [0, num_blocks): the row is written as zeros;
                   ///< counted per row
  slot = 3,        ///< an insert slot outside [-1, num_blocks * block_size): the row is skipped;
                   ///< counted per row
  topk_index = 4,  ///< a top-k index other than -1 outside 0 .. seq_len/r - 1: written as -1;
                   ///< counted per entry
};
inline constexpr int kFaultKinds = 5;

/// @brief Details of one fault. `request` is -1 where the op has no request (insert);
///        `position` is a row, sequence position or token index, `value` the offending value.
struct FaultRecord {
  std::int32_t kind;
  std::int32_t request;
  std::int32_t position;
  std::int32_t value;
};

/// @brief The per-step status block (device memory). In an executor's step the stage-in kernel
///        zeroes it (after folding it into RunFaults); a standalone op's caller zeroes it with reset().
struct StepStatus {
  std::uint32_t counts[kFaultKinds];  ///< faults of each kind this step
  std::uint32_t recorded;             ///< nonzero once `first` holds a fault
  FaultRecord first;                  ///< the first fault that claimed the record

  [[nodiscard]] std::uint32_t count(Fault f) const noexcept { return counts[static_cast<int>(f)]; }
  [[nodiscard]] std::uint64_t total() const noexcept {
    std::uint64_t t = 0;
    for (std::uint32_t c : counts) t += c;
    return t;
  }
};
static_assert(sizeof(StepStatus) == 40, "StepStatus is read by the host as raw bytes");

/// @brief The faults of every step an executor ran, folded in by each step's stage-in kernel from
///        the step before it (the last step's counts join when the host reads them:
///        Executor::read_run_faults).
struct RunFaults {
  std::uint64_t counts[kFaultKinds];  ///< faults of each kind over the run
  std::uint64_t faulty_steps;         ///< steps with at least one fault
  std::uint32_t recorded;             ///< nonzero once `first` holds the run's first recorded fault
  std::uint32_t reserved;
  FaultRecord first;                  ///< the first fault of the first faulty step

  [[nodiscard]] std::uint64_t count(Fault f) const noexcept { return counts[static_cast<int>(f)]; }
  [[nodiscard]] std::uint64_t total() const noexcept {
    std::uint64_t t = 0;
    for (std::uint64_t c : counts) t += c;
    return t;
  }
  /// Adds one step's counts (what the stage-in kernel does on the device, for the host's read).
  void add(const StepStatus& step) noexcept {
    bool any = false;
    for (int k = 0; k < kFaultKinds; ++k) {
      counts[k] += step.counts[k];
      any = any || step.counts[k] != 0;
    }
    if (any) ++faulty_steps;
    if (recorded == 0 && step.recorded != 0) {
      first = step.first;
      recorded = 1;
    }
  }
};
static_assert(sizeof(RunFaults) == 72, "RunFaults is read by the host as raw bytes");

/// @brief An executor's status block: the step's counters (what every kernel's `status` points
///        at) and the run's totals, which only the stage-in kernel writes.
struct StatusBlock {
  StepStatus step;
  /// Per staging block (the chunk blocks 0, 1, then the step blocks 0, 1): CTAs of the kernel
  /// reading it that are done (StagingRelease::arrivals; zero between launches).
  std::uint32_t staging_arrivals[4];
  std::uint32_t reserved[2];  ///< keeps `run` 64 bytes in
  RunFaults run;
};
static_assert(sizeof(StatusBlock) == 136 && alignof(StatusBlock) == 8, "StatusBlock is read by the host as raw bytes");

/// @brief Zeroes the status block on `stream` (a memset), for ops called outside an executor; an
///        executor's steps never call it: their stage-in kernel zeroes the block.
[[nodiscard]] inline cudaError_t reset(StepStatus* status, cudaStream_t stream) noexcept {
  return cudaMemsetAsync(status, 0, sizeof(StepStatus), stream);
}

/// @brief Name of a fault kind, for messages.
[[nodiscard]] inline const char* fault_name(Fault f) noexcept {
  switch (f) {
    case Fault::scalars: return "scalars";
    case Fault::seq_len: return "seq_len";
    case Fault::block_id: return "block_id";
    case Fault::slot: return "slot";
    case Fault::topk_index: return "topk_index";
  }
  return "unknown";
}

#if defined(__CUDACC__)
/// Counts `n` faults of one kind and offers (request, position, value) as the step's first record.
/// A null `status` counts nothing (a standalone op called without a status block): the fault is
/// still handled as the op's rules say, only not reported.
__device__ inline void record_fault(StepStatus* status, Fault kind, std::uint32_t n, int request, int position,
                                    int value) {
  if (status == nullptr) return;
  atomicAdd(&status->counts[static_cast<int>(kind)], n);
  if (atomicCAS(&status->recorded, 0U, 1U) == 0U) {
    status->first = FaultRecord{static_cast<std::int32_t>(kind), request, position, value};
  }
}
#endif

}  // namespace spg::kernels
