// serve_loop's command line: its options, the parser and the help text, apart from the sample so
// that tests and a fuzzer can drive the parser (it never exits; errors come back as text).
//
// Numbers are strict: an integer is decimal digits only (no sign, space or hex prefix), a rate a
// plain decimal ("0.5", "2e-3"); every bound is stated once, in the flag table the parser and
// --help both read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spgraph/scheduler/workload.hpp"

namespace spg::samples {

struct ServeLoopOptions {
  bool plan_only{false};
  bool eager{false};
  bool progress{true};
  bool checksum{false};
  bool require_gpu{false};
  bool count_allocations{true};  // --no-alloc-count: leave CUPTI unloaded (it slows every graph launch)
  bool derive_slots{false};      // --derive-slots: leave the insert slots to the device
  bool engine_buffers{false};    // --engine-buffers: caches and tensors from the model front's own cudaMallocs
  bool allow_faults{false};      // --allow-faults: device faults over the run do not fail the exit code
  bool one_launch{false};        // --one-launch: each scheduler step whole through run(StepInput)
  int step_requests{64};         // --step-requests: max_step_requests with --one-launch
  int flat_steps{0};             // --flat-steps: flat_step_chunks with --one-launch
  bool flat_pad{false};          // --flat-pad: flat_step_pad (with --flat-steps)
  long steps{1000};
  int verify{0};
  std::string json;
  std::uint64_t seed{1};
  int requests{256};
  int min_len{1024};
  int max_len{65536};
  scheduler::LengthDistribution lengths{scheduler::LengthDistribution::log_normal};
  scheduler::ArrivalPattern arrivals{scheduler::ArrivalPattern::all_at_once};
  double rate{1.0};
  int budget{8192};
  int max_requests{4};
  int max_tokens{2048};
  int max_model_len{65536};
};

/// @brief An integer flag's bounds, as the parser enforces them and --help prints them.
struct IntegerFlag {
  const char* name;
  long long lo;
  long long hi;
};
/// Every integer flag of serve_loop.
[[nodiscard]] const std::vector<IntegerFlag>& serve_loop_integer_flags();

/// @brief What a command line asked for: the options, or --help, or a usage error.
struct ParsedCommandLine {
  ServeLoopOptions options;
  bool help{false};
  std::string error;  ///< non-empty: the usage error (the flag, the value and what it must be)
};

/// Parses `args` (without the program name). Never throws for a bad command line, never exits.
[[nodiscard]] ParsedCommandLine parse_serve_loop_options(const std::vector<std::string>& args);

/// The --help text.
[[nodiscard]] std::string serve_loop_help();

/// A strict decimal integer in [lo, hi]: digits only. Returns false (leaving `value`) otherwise.
[[nodiscard]] bool parse_decimal(const std::string& text, long long lo, long long hi, long long& value) noexcept;
/// A strict plain decimal number ("1", "0.25", "2e-3", ".5"; no sign, space, hex, inf or nan).
[[nodiscard]] bool parse_plain_decimal(const std::string& text, double& value) noexcept;

}  // namespace spg::samples
